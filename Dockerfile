# cronlog node image: `docker build -t cronlog .`
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY core core
COPY eventlog eventlog
COPY archive archive
COPY projections projections
COPY node node
COPY api api
COPY cli cli
COPY tools tools
COPY sdk sdk
# The versions CI tested (constraints.txt), within pyproject.toml's ranges.
RUN pip install --no-cache-dir -c constraints.txt .
# The node runs as a user of its own, owning only its data directory.
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin cronlog \
    && mkdir -p /data && chown cronlog:cronlog /data && chmod 700 /data
USER cronlog
EXPOSE 8080
VOLUME /data
# Healthy once the node owns its partitions and has caught up (GET /readyz answers 200; 503
# before). The start period covers the check of the log at start-up. The slim image has no
# curl: Python asks.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=2)"]
ENTRYPOINT ["cronlog", "serve", "--host", "0.0.0.0", "--port", "8080", "--data-dir", "/data"]
