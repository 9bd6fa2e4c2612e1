"""A service cronlog calls, made to handle each run once: one line of middleware.

    CRONLOG_URL=... CRONLOG_TOKEN=... python examples/target_service.py

The node must be allowed to call this machine (``cronlog serve --allow-targets 127.0.0.0/8``).
The service starts on a free port, registers a job that calls it, and answers slowly on the
first attempt, so cronlog times that attempt out and sends the next while the first still runs:
the middleware tells the second to try again, and answers the third with the first's result.
The invoice is sent once. Then it cancels the job and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import socket
import uuid

import uvicorn
from cronlog_client import AsyncClient, CronlogTargetMiddleware, JobDefinition, NotFound
from cronlog_client.models import BackoffIn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sent: list[str] = []


async def send_invoice(request: Request) -> JSONResponse:
    body = await request.json()
    if not sent:
        await asyncio.sleep(2)  # slower than the job's timeout: cronlog tries again meanwhile
    sent.append(body["run_id"])
    print(f"invoice sent for run {body['run_id']} (attempt {body['attempt']})")
    return JSONResponse({"invoice": f"inv-{body['run_id']}"})


app = CronlogTargetMiddleware(Starlette(routes=[Route("/invoice", send_invoice, methods=["POST"])]))


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    async with AsyncClient() as cronlog:
        job_id = f"invoice-{uuid.uuid4().hex[:8]}"
        slot = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
        await cronlog.put_job(
            job_id,
            JobDefinition(
                name="invoice",
                run_at=slot,
                target=f"http://127.0.0.1:{port}/invoice",
                timeout_sec=1,
                retries=5,
                backoff=BackoffIn(base_sec=0.5, factor=1, jitter=False),
            ),
        )
        run_id = f"{job_id}.{int(slot.timestamp() * 1000)}"
        run = None
        for _ in range(200):  # until the run is done (a demo; a service would not wait)
            with contextlib.suppress(NotFound):  # there is no run before its slot
                run = await cronlog.get_run(run_id)
            if run is not None and run.state in ("succeeded", "dead"):
                break
            await asyncio.sleep(0.1)
        assert run is not None
        attempts = ", ".join(f"{a.attempt}: {a.outcome} {a.error[:30]}" for a in run.attempts)
        print(f"run {run.state} after attempts [{attempts}]; invoices sent: {len(sent)}")
        await cronlog.cancel_job(job_id)
    server.should_exit = True
    await serving


if __name__ == "__main__":
    asyncio.run(main())
