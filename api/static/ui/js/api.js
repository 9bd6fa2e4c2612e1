// The one way the UI talks to cronlog: the public /v1 API on this origin, with the team's
// bearer token. The token lives in this tab's sessionStorage only (gone when the tab closes,
// never in a URL, a cookie or localStorage), and goes out only in the Authorization header.

const KEY = "cronlog.token";

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
    this.field = this.body.field || null;
  }
}

export const session = {
  token: () => sessionStorage.getItem(KEY),
  signIn: (token) => sessionStorage.setItem(KEY, token),
  signOut: () => sessionStorage.removeItem(KEY),
};

let onUnauthorized = () => {};
export function whenUnauthorized(handler) { onUnauthorized = handler; }

export async function api(method, path, { body, query, headers, token } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const init = {
    method,
    headers: { Authorization: `Bearer ${token || session.token()}`, ...(headers || {}) },
    credentials: "omit",
    cache: "no-store",
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { message: text.slice(0, 200) }; }
  if (response.status === 401 && !token) onUnauthorized();
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path, query) => api("GET", path, { query });
export const post = (path, body, opts) => api("POST", path, { body, ...(opts || {}) });
export const patch = (path, body, opts) => api("PATCH", path, { body, ...(opts || {}) });
