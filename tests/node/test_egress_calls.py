"""The egress policy at call time, against real targets on loopback: checked on the address
actually connected to, after resolution; resolved once, so rebinding gets nowhere; what a team
reads of a failure is bounded and says nothing of port state; secrets are read per call."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from core import events as ev
from core.commands import Outcome, PutJob
from core.egress import EgressPolicy
from core.jobs import Backoff, HttpTarget, JobSpec, KafkaTarget, SecretRef
from eventlog.embedded import EmbeddedLog
from node.egress import EgressRefused, PolicyResolver
from node.egress_config import is_local_address
from node.executors import Executors, Result
from node.node import Node
from node.secrets import Secrets

pytestmark = pytest.mark.slow

LOOPBACK = EgressPolicy.build(allow=["127.0.0.0/8"])
ONLY_127_0_0_1 = EgressPolicy.build(allow=["127.0.0.1/32"])


def lease(tenant: str = "team-a") -> ev.LeaseGranted:
    return ev.LeaseGranted(
        at=1_000,
        job_id="report",
        tenant=tenant,
        run_id="report.60000",
        scheduled_for=60_000,
        attempt=1,
        fencing_token=7,
        worker_id="n1/executor",
        lease_expires_at=31_000,
        lateness_ms=0,
    )


class Recorder:
    """An HTTP target on a loopback address that records each request and answers as told."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.requests: list[dict[str, str]] = []
        self.status = 200
        self.body = b"ok"
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append(dict(self.headers.items()))
                self.send_response(recorder.status)
                self.send_header("Content-Length", str(len(recorder.body)))
                self.end_headers()
                self.wfile.write(recorder.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Answers(AbstractResolver):
    """A resolver the test controls: each host's successive answers (the last one repeats)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        sequence = self.answers[host]
        addresses = sequence.pop(0) if len(sequence) > 1 else sequence[0]
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in addresses
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
def target() -> Iterator[Recorder]:
    t = Recorder()
    yield t
    t.stop()


class Running:
    """Executors started for one test and stopped after it."""

    def __init__(self) -> None:
        self.started: list[Executors] = []

    def __call__(self, policy: EgressPolicy, **options: Any) -> Executors:
        ex = Executors("n1", egress=policy, **options)
        ex.start()
        self.started.append(ex)
        return ex


@pytest.fixture
def executors() -> Iterator[Running]:
    running = Running()
    yield running
    for ex in running.started:
        ex.stop()


def call(
    ex: Executors,
    url: str,
    *,
    timeout_sec: float = 5.0,
    headers: dict[str, str | SecretRef] | None = None,
    tenant: str = "team-a",
) -> Result:
    spec = JobSpec(
        name="report",
        tenant=tenant,
        target=HttpTarget(url=url, headers=headers or {}),
        run_at=60_000,
        timeout_sec=timeout_sec,
    )
    return asyncio.run_coroutine_threadsafe(ex.call(lease(tenant), spec), ex._loop).result(30)


def assert_refused(result: Result) -> None:
    assert result.outcome is Outcome.FAILED
    assert result.permanent and not result.ambiguous  # never retried
    assert result.error.startswith("egress policy: "), result.error


# -- where a call may go -------------------------------------------------------------------------


def test_a_name_that_resolves_to_a_denied_address_is_refused_and_nothing_is_sent(
    executors: Running, target: Recorder
) -> None:
    resolver = Answers({"reports.test": [["127.0.0.1"]]})
    denied = executors(EgressPolicy(), resolver=resolver)
    assert_refused(call(denied, f"http://reports.test:{target.port}/hook"))
    assert resolver.asked == ["reports.test"]
    assert target.requests == []
    # The same name, where the operator allows loopback, reaches the target: the refusal was
    # the policy's, not a resolver or a target that could not answer.
    allowed = executors(LOOPBACK, resolver=Answers({"reports.test": [["127.0.0.1"]]}))
    assert call(allowed, f"http://reports.test:{target.port}/hook").outcome is Outcome.SUCCEEDED
    assert len(target.requests) == 1


def test_localhost_through_the_systems_resolver_is_refused_when_loopback_is_not_allowed(
    executors: Running, target: Recorder
) -> None:
    assert_refused(call(executors(EgressPolicy()), f"http://localhost:{target.port}/hook"))
    assert target.requests == []


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]"]
)
def test_an_address_in_any_spelling_is_decided_at_call_time_as_the_address_it_is(
    executors: Running, target: Recorder, host: str
) -> None:
    # Jobs registered under an older, looser policy are held to the node's policy of today.
    assert_refused(call(executors(EgressPolicy()), f"http://{host}:{target.port}/hook"))
    assert target.requests == []
    # ... and where loopback is allowed, every spelling reaches the one address checked.
    result = call(executors(LOOPBACK), f"http://{host}:{target.port}/hook")
    assert result.outcome is Outcome.SUCCEEDED, result
    assert len(target.requests) == 1


@pytest.mark.parametrize(
    "host", ["metadata.google.internal", "METADATA.goog.", "0xa9fea9fe", "2852039166"]
)
def test_metadata_in_any_form_is_refused_before_any_lookup(
    executors: Running, target: Recorder, host: str
) -> None:
    # Even a resolver that would send the call to a listening target never gets asked.
    resolver = Answers({host: [["127.0.0.1"]]})
    ex = executors(EgressPolicy.build(allow=["127.0.0.0/8", "*.internal"]), resolver=resolver)
    assert_refused(call(ex, f"http://{host}:{target.port}/computeMetadata/v1/"))
    assert resolver.asked == [] and target.requests == []


def test_only_this_machines_addresses_count_as_local() -> None:
    assert is_local_address(ipaddress.ip_address("127.0.0.1"))
    assert is_local_address(ipaddress.ip_address("127.0.0.53"))
    assert is_local_address(ipaddress.ip_address("::1"))
    assert not is_local_address(ipaddress.ip_address("192.0.2.1"))  # TEST-NET-1: nobody's
    assert not is_local_address(ipaddress.ip_address("2001:db8::1"))


def test_this_nodes_own_api_port_is_refused_even_with_loopback_allowed(
    executors: Running, target: Recorder
) -> None:
    own = EgressPolicy.build(allow=["127.0.0.0/8"], own_ports=[target.port])
    resolver = Answers({"api.test": [["127.0.0.1"]]})
    ex = executors(own, resolver=resolver)
    assert_refused(call(ex, f"http://127.0.0.1:{target.port}/v1/jobs"))
    assert_refused(call(ex, f"http://api.test:{target.port}/v1/jobs"))
    assert target.requests == []


def test_the_connection_goes_to_the_checked_address_however_the_name_rebinds(
    executors: Running,
) -> None:
    # Two real targets on one port: the allowed address, and a denied one that would record
    # any call that reached it.
    allowed = Recorder("127.0.0.1")
    denied = Recorder("127.0.0.2", allowed.port)
    try:
        # The name answers the allowed address first, then the denied one (a rebinding
        # attacker's DNS): a check that resolved separately from the connection would pass
        # the first answer and connect to the second.
        resolver = Answers({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
        ex = executors(ONLY_127_0_0_1, resolver=resolver)
        results = [call(ex, f"http://rebind.test:{allowed.port}/hook") for _ in range(3)]
        assert denied.requests == []
        assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 3, results
        assert len(allowed.requests) == 3
        # And an answer that mixes both is connected to only at the address that passes.
        mixed = executors(
            ONLY_127_0_0_1, resolver=Answers({"mixed.test": [["127.0.0.2", "127.0.0.1"]]})
        )
        assert call(mixed, f"http://mixed.test:{allowed.port}/hook").outcome is Outcome.SUCCEEDED
        assert len(allowed.requests) == 4 and denied.requests == []
    finally:
        allowed.stop()
        denied.stop()


def test_the_resolver_refuses_a_later_answer_that_rebinds_to_a_denied_address() -> None:
    async def resolve_twice() -> tuple[list[ResolveResult], BaseException | None]:
        resolver = PolicyResolver(
            ONLY_127_0_0_1, Answers({"rebind.test": [["127.0.0.1"], ["169.254.169.254"]]})
        )
        first = await resolver.resolve("rebind.test", 80)
        try:
            await resolver.resolve("rebind.test", 80)
        except EgressRefused as err:
            return first, err
        return first, None

    first, second = asyncio.run(resolve_twice())
    assert [r["host"] for r in first] == ["127.0.0.1"]
    assert isinstance(second, EgressRefused)
    assert "169.254" not in str(second)  # the team does not learn where its name pointed


def test_tls_keeps_the_host_name_for_sni_while_connecting_to_the_checked_address(
    executors: Running,
) -> None:
    # A plain socket stands in for the TLS server: the ClientHello it receives carries the
    # server name in clear (the SNI extension), whatever address the client connected to.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    hello: list[bytes] = []

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            hello.append(conn.recv(4096))

    threading.Thread(target=accept, daemon=True).start()
    try:
        resolver = Answers({"billing.tls.test": [["127.0.0.1"]]})
        result = call(executors(LOOPBACK, resolver=resolver), f"https://billing.tls.test:{port}/")
    finally:
        server.close()
    assert resolver.asked == ["billing.tls.test"]
    assert hello and hello[0][:1] == b"\x16"  # a TLS handshake record reached 127.0.0.1
    assert b"billing.tls.test" in hello[0]  # named by host name, not by address
    assert result.outcome is Outcome.FAILED and not result.permanent


# -- what a team reads of a failure ------------------------------------------------------------


NOISY = b"\x1b[2J\x1b]0;owned\x07" + b"internal detail \r\nX-Forged: 1\t\x00 " * 400


def test_an_error_excerpt_is_bounded_and_holds_no_control_characters(
    executors: Running, target: Recorder
) -> None:
    target.status, target.body = 500, NOISY
    result = call(executors(LOOPBACK), f"http://127.0.0.1:{target.port}/hook")
    assert result.error.startswith("HTTP 500: ")
    assert len(result.error) <= len("HTTP 500: ") + 200
    assert result.error.isprintable()
    assert "internal detail X-Forged: 1 internal detail" in result.error


def test_an_error_excerpt_can_be_turned_off_or_resized(
    executors: Running, target: Recorder
) -> None:
    target.status, target.body = 404, NOISY
    url = f"http://127.0.0.1:{target.port}/hook"
    assert call(executors(LOOPBACK, error_excerpt_bytes=0), url).error == "HTTP 404"
    sized = call(executors(LOOPBACK, error_excerpt_bytes=40), url).error
    assert sized.startswith("HTTP 404: ") and len(sized) <= len("HTTP 404: ") + 40
    with pytest.raises(ValueError):
        Executors("n1", error_excerpt_bytes=100_000)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # bound, never listening: connections are refused


def test_a_call_that_cannot_be_made_says_unreachable_whatever_the_port_does(
    executors: Running,
) -> None:
    # A port whose backlog is full drops new connections: connecting times out, as it does on
    # a filtered port.
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    filler = socket.create_connection(full.getsockname()[:2])
    try:
        ex = executors(LOOPBACK, resolver=Answers({}))
        closed = call(ex, f"http://127.0.0.1:{_closed_port()}/hook", timeout_sec=1.0)
        filtered = call(ex, f"http://127.0.0.1:{full.getsockname()[1]}/hook", timeout_sec=1.0)
        no_name = call(ex, "http://nowhere.test/hook", timeout_sec=1.0)
    finally:
        filler.close()
        full.close()
    assert closed == filtered == no_name == Result(Outcome.FAILED, "unreachable")


def test_a_connection_lost_after_the_request_was_sent_may_have_taken_effect(
    executors: Running,
) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def read_then_hang_up() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)

    threading.Thread(target=read_then_hang_up, daemon=True).start()
    try:
        result = call(executors(LOOPBACK), f"http://127.0.0.1:{server.getsockname()[1]}/")
    finally:
        server.close()
    assert result.ambiguous and not result.permanent
    assert result.error == "the connection failed after the request was sent"


# -- secrets -------------------------------------------------------------------------------------


def test_a_secret_reference_is_read_from_the_teams_directory_at_each_call(
    executors: Running, target: Recorder, tmp_path: Path
) -> None:
    (tmp_path / "team-a").mkdir()
    token = tmp_path / "team-a" / "billing-token"
    token.write_text("Bearer s3cr3t-1\n")
    ex = executors(LOOPBACK, secrets=Secrets(tmp_path))
    url = f"http://127.0.0.1:{target.port}/hook"
    headers: dict[str, str | SecretRef] = {"Authorization": SecretRef(from_file="billing-token")}
    assert call(ex, url, headers=headers).outcome is Outcome.SUCCEEDED
    token.write_text("Bearer s3cr3t-2\n")  # rotated: the next call uses the new value
    assert call(ex, url, headers=headers).outcome is Outcome.SUCCEEDED
    assert [r["Authorization"] for r in target.requests] == ["Bearer s3cr3t-1", "Bearer s3cr3t-2"]


def test_a_missing_secret_fails_for_good_naming_the_secret_and_sends_nothing(
    executors: Running, target: Recorder, tmp_path: Path
) -> None:
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "billing-token").write_text("Bearer team-a-only\n")
    ex = executors(LOOPBACK, secrets=Secrets(tmp_path))
    url = f"http://127.0.0.1:{target.port}/hook"
    ref: dict[str, str | SecretRef] = {"Authorization": SecretRef(from_file="billing-token")}
    # Another team naming the same secret reads its own directory, where there is none.
    other = call(ex, url, headers=ref, tenant="team-b")
    missing = call(ex, url, headers={"Authorization": SecretRef(from_file="nope")})
    for result, name in ((other, "billing-token"), (missing, "nope")):
        assert result.outcome is Outcome.FAILED and result.permanent
        assert f"secret {name!r}" in result.error
        assert "team-a-only" not in result.error
    assert target.requests == []


def test_a_secret_that_would_forge_headers_is_never_sent(
    executors: Running, target: Recorder, tmp_path: Path
) -> None:
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "token").write_text("Bearer x\r\nX-Forged: 1\n")
    ex = executors(LOOPBACK, secrets=Secrets(tmp_path))
    result = call(
        ex,
        f"http://127.0.0.1:{target.port}/hook",
        headers={"Authorization": SecretRef(from_file="token")},
    )
    assert result.permanent and "secret 'token'" in result.error
    assert "Forged" not in result.error
    assert target.requests == []


def test_headers_a_job_stored_before_the_checks_are_refused_at_call_time(
    executors: Running, target: Recorder
) -> None:
    result = call(
        executors(LOOPBACK),
        f"http://127.0.0.1:{target.port}/hook",
        headers={"X-Cronlog-Fencing-Token": "999999"},
    )
    assert result.permanent and "target.headers.X-Cronlog-Fencing-Token" in result.error
    assert target.requests == []


# -- Kafka topics --------------------------------------------------------------------------------


class Producer:
    def __init__(self) -> None:
        self.produced: list[str] = []

    def produce(self, topic: str, **_: Any) -> None:
        self.produced.append(topic)

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0


@pytest.mark.parametrize("topic", ["cronlog.events", "cronlog.commands", "__consumer_offsets"])
def test_a_kafka_target_on_the_clusters_own_topics_is_refused_at_call_time(
    executors: Running, topic: str
) -> None:
    producer = Producer()
    ex = executors(
        EgressPolicy.build(topics=["*=*"]),
        kafka_bootstrap="127.0.0.1:9",
        producer_factory=lambda _bootstrap: producer,
    )
    spec = JobSpec(name="r", tenant="team-a", target=KafkaTarget(topic=topic), run_at=60_000)
    result = asyncio.run_coroutine_threadsafe(ex.call(lease(), spec), ex._loop).result(30)
    assert_refused(result)
    assert producer.produced == []


def test_a_kafka_target_outside_the_teams_grant_is_refused_at_call_time(
    executors: Running,
) -> None:
    producer = Producer()
    ex = executors(
        EgressPolicy.build(topics=["team-a=billing."]),
        kafka_bootstrap="127.0.0.1:9",
        producer_factory=lambda _bootstrap: producer,
    )
    spec = JobSpec(name="r", tenant="team-b", target=KafkaTarget(topic="billing.x"), run_at=60_000)
    assert_refused(
        asyncio.run_coroutine_threadsafe(ex.call(lease("team-b"), spec), ex._loop).result(30)
    )
    assert producer.produced == []


# -- on a node -------------------------------------------------------------------------------------


def test_a_refused_call_dead_letters_at_once_and_is_never_retried(
    tmp_path: Path, target: Recorder
) -> None:
    # A job stored before the operator closed loopback (the log keeps it): its run ends dead on
    # the first attempt, its error saying why.
    log = EmbeddedLog.open(tmp_path / "log", 2)
    node = Node(log, tmp_path / "node", node_id="n1", executors=Executors("n1"))
    node.start()
    try:
        assert node.wait_ready(10)
        slot = time.time_ns() // 1_000_000 + 200
        spec = JobSpec(
            name="old",
            tenant="team-a",
            target=HttpTarget(url=f"http://127.0.0.1:{target.port}/hook"),
            run_at=slot,
            max_attempts=5,
            backoff=Backoff(base_sec=0.1, jitter=False),
        )
        asyncio.run(node.execute(PutJob(job_id="old", spec=spec)))
        run_id = f"old.{slot}"

        def dead() -> bool:
            view = node.history.run("team-a", run_id)
            return view is not None and view.state == "dead"

        assert node.history.wait_until(dead, 10)
        view = node.history.run("team-a", run_id)
        assert view is not None
        assert view.dead_reason == "permanent_failure" and len(view.attempts) == 1
        assert view.error.startswith("egress policy: 127.0.0.1 is a loopback address")
        assert target.requests == []
    finally:
        node.stop()
        log.close()
