# Sourced by scripts/serve and scripts/test (not a command): cronlog installed into .venv,
# editable, with the versions constraints.txt pins.
#
# The two commands share .venv, and a service started during a test run must not reinstall the
# package under the tests: install_cronlog installs only when what .venv holds is out of date.
# A stamp in .venv records a hash of what the install depends on (the interpreter, pyproject.toml,
# constraints.txt) and the extras installed with it; the same hash with every extra asked for
# already there means nothing to do. pip's output, setuptools' notice about editable
# installations included, is shown only when the install fails.

# install_cronlog [EXTRAS]: e.g. install_cronlog test,bench. Run from the repository's root.
install_cronlog() {
  local extras="${1:-}" stamp=.venv/.cronlog-install want have_hash have_extras extra log
  [ -x .venv/bin/python ] || python3 -m venv .venv
  want="$( { .venv/bin/python -c 'import sys; print(sys.version)'; cat pyproject.toml constraints.txt; } \
    | sha256sum | cut -d' ' -f1)"
  exec 9>.venv/.cronlog-install.lock
  flock 9  # two commands started at once: one installs, the other then finds it done
  if [ -f "$stamp" ] && read -r have_hash have_extras <"$stamp" && [ "$have_hash" = "$want" ]; then
    local missing=""
    for extra in ${extras//,/ }; do
      [[ ",$have_extras," == *",$extra,"* ]] || missing=1
    done
    if [ -z "$missing" ]; then
      exec 9>&-
      return 0
    fi
  fi
  echo "$(basename "$0"): installing cronlog${extras:+ [$extras]} into .venv (pyproject.toml, constraints.txt or Python changed since the last install)" >&2
  rm -f "$stamp"
  log="$(mktemp)"
  if ! {
    .venv/bin/python -m pip install --upgrade pip &&
      .venv/bin/python -m pip install -c constraints.txt -e ".${extras:+[$extras]}"
  } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exec 9>&-
    return 1
  fi
  rm -f "$log"
  echo "$want $extras" >"$stamp"
  exec 9>&-
}
