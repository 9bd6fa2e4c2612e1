"""The registration floor: a bare Starlette endpoint under the uvicorn settings ``cronlog serve``
uses, in a process of its own.

    python -m bench.bare_starlette --port P [--log-level info]

``POST /v1/jobs`` decodes the JSON body, adds an id and answers it with 201: the work any
handler does (read, parse, encode, answer) without authentication, validation, the log or the
read model. Keep :func:`config` in step with ``cli/main.py``'s ``uvicorn.Config``: loop and
HTTP parser on ``auto`` (uvloop and httptools when installed), the same log level (uvicorn's
access log at ``info``), lifespan on.
"""

from __future__ import annotations

import argparse
import itertools

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_ids = itertools.count()


async def create(request: Request) -> Response:
    job = msgspec.json.decode(await request.body())
    job["job_id"] = f"j_{next(_ids):012d}"
    return Response(msgspec.json.encode(job), status_code=201, media_type="application/json")


app = Starlette(routes=[Route("/v1/jobs", create, methods=["POST"])])


def config(port: int, log_level: str) -> uvicorn.Config:
    # As cli/main.py's serve configures uvicorn (its access log is off unless asked for).
    return uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level=log_level, lifespan="on", access_log=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    uvicorn.Server(config(args.port, args.log_level)).run()


if __name__ == "__main__":
    main()
