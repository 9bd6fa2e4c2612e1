"""The egress policy over every spelling of an address and every form of a host name."""

from __future__ import annotations

import ipaddress

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from core.egress import EgressPolicy, Rule, TopicGrant, parse_host
from core.errors import EgressDenied, InvalidDefinition
from core.jobs import HttpTarget, KafkaTarget, PullTarget

DEFAULT = EgressPolicy()
LOOPBACK = EgressPolicy.build(allow=["127.0.0.0/8", "::1"])

METADATA_V4 = ipaddress.ip_address("169.254.169.254")
FULL_WIDTH_METADATA = "\uff4d\uff45\uff54\uff41\uff44\uff41\uff54\uff41.google.internal"

# Every way a URL's host can name 169.254.169.254, the address cloud metadata answers on.
METADATA_SPELLINGS = [
    "169.254.169.254",
    "169.254.169.254.",
    "0xa9fea9fe",
    "0xA9FEA9FE",
    "0XA9FEA9FE",
    "2852039166",
    "0251.0376.0251.0376",
    "0xa9.0xfe.0xa9.0xfe",
    "169.254.43518",  # a.b.c with c filling two bytes
    "169.16689662",  # a.b with b filling three bytes
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[0:0:0:0:0:ffff:a9fe:a9fe]",
]
# ... and the loopback address, which the default policy also denies.
LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "127.0.1",
    "0x7f000001",
    "2130706433",
    "0177.0.0.1",
    "017700000001",
    "127.000.000.001",
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.1]",
    "localhost",
    "LOCALHOST",
    "localhost.",
    "anything.localhost",
]
# ... written beyond ASCII: a URL parser reads them in ASCII (UTS #46: NFKC, the full stops
# U+3002, U+FF0E and U+FF61 as ".") before it connects, so each is an address, not a name.
UNICODE_SPELLINGS = [
    ("169\u3002254\u3002169\u3002254", "169.254.169.254"),  # ideographic full stops
    ("169\uff0e254\uff0e169\uff0e254", "169.254.169.254"),  # full-width full stops
    ("169\uff61254\uff61169\uff61254", "169.254.169.254"),  # half-width ideographic
    ("\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11", "127.0.0.1"),  # full width
    ("\uff10\uff58\uff41\uff19\uff46\uff45\uff41\uff19\uff46\uff45", "169.254.169.254"),
    ("\uff12\uff18\uff15\uff12\uff10\uff13\uff19\uff11\uff16\uff16", "169.254.169.254"),
    ("0x7f\uff611", "127.0.0.1"),
    ("\u2460\u2461\u2466.0.0.1", "127.0.0.1"),  # circled digits
    ("\U0001d7cf\U0001d7d0\U0001d7d5.1", "127.0.0.1"),  # mathematical bold digits
    ("127.0.0.1\u3002", "127.0.0.1"),  # a trailing full stop
    ("\uff11\uff10.\uff10.\uff10.\uff11", "10.0.0.1"),
]
UNSPECIFIED_SPELLINGS = ["0", "0.0.0.0", "0x0", "00", "0.0", "[::]", "[0:0:0:0:0:0:0:0]"]


@pytest.mark.parametrize("host", METADATA_SPELLINGS)
def test_every_spelling_of_the_metadata_address_is_that_address(host: str) -> None:
    assert parse_host(host) == METADATA_V4


@pytest.mark.parametrize("host", METADATA_SPELLINGS)
def test_every_spelling_of_the_metadata_address_is_refused_even_when_link_local_is_allowed(
    host: str,
) -> None:
    everything = EgressPolicy.build(allow=["0.0.0.0/0", "::/0", "169.254.0.0/16"])
    for policy in (DEFAULT, everything):
        reason = policy.check_url(f"http://{host}/latest/meta-data/")
        assert reason is not None and "metadata" in reason, (host, reason)


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_every_spelling_of_loopback_is_refused_by_default_and_allowed_when_the_operator_says(
    host: str,
) -> None:
    reason = DEFAULT.check_url(f"http://{host}:22/")
    assert reason is not None and "loopback" in reason, (host, reason)
    assert LOOPBACK.check_url(f"http://{host}:22/") is None


@pytest.mark.parametrize(("host", "address"), UNICODE_SPELLINGS)
def test_every_unicode_spelling_of_an_address_is_that_address_and_refused(
    host: str, address: str
) -> None:
    assert parse_host(host) == ipaddress.ip_address(address)
    assert DEFAULT.check_url(f"http://{host}/") is not None


# The addresses no team may reach by default, and the ways a system resolver reads numbers.
REFUSED = [
    "169.254.169.254",
    "169.254.170.2",
    "100.100.100.200",
    "127.0.0.1",
    "127.255.0.9",
    "10.1.2.3",
    "192.168.0.1",
    "172.16.5.4",
    "0.0.0.0",
]
# Characters that NFKC (and so UTS #46) reads as each ASCII digit: full width, mathematical
# bold, double-struck, sans-serif and monospace, superscript, subscript, circled 0-9.
DIGITS = {
    str(d): [
        str(d),
        chr(0xFF10 + d),
        chr(0x1D7CE + d),
        chr(0x1D7D8 + d),
        chr(0x1D7E2 + d),
        chr(0x1D7F6 + d),
        "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"[d],
        chr(0x2080 + d),
        "\u24ea" if d == 0 else chr(0x245F + d),
    ]
    for d in range(10)
}
OTHERS = {
    c: [c, c.upper(), chr(0xFF41 + ord(c) - ord("a")), chr(0xFF21 + ord(c) - ord("a"))]
    for c in "abcdefx"
}
DOTS = [".", "\u3002", "\uff0e", "\uff61"]


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, ipaddress.IPv4Address]:
    """A refused IPv4 address, and a way to write it: dotted in 1-4 parts, each decimal, octal
    or hex, then each character in any form NFKC reads as it, with any of the four full stops."""
    address = ipaddress.IPv4Address(draw(st.sampled_from(REFUSED)))
    octets = list(address.packed)
    parts_count = draw(st.integers(1, 4))
    # inet_aton: the last part fills the bytes the others leave.
    parts = [*octets[: parts_count - 1], int.from_bytes(bytes(octets[parts_count - 1 :]), "big")]
    written = []
    for part in parts:
        radix = draw(st.sampled_from(["dec", "oct", "hex"]))
        text = {"dec": str(part), "oct": f"0{part:o}", "hex": f"0x{part:x}"}[radix]
        written.append(text)
    ascii_form = ".".join(written) + draw(st.sampled_from(["", "."]))
    out = []
    for c in ascii_form:
        forms = DIGITS.get(c) or OTHERS.get(c) or DOTS
        out.append(draw(st.sampled_from(forms)))
    return "".join(out), address


@given(spellings())
def test_every_spelling_of_a_refused_address_is_read_as_it_and_refused(
    spelling: tuple[str, ipaddress.IPv4Address],
) -> None:
    host, address = spelling
    assert parse_host(host) == address, ascii(host)
    assert DEFAULT.check_url(f"http://{host}/") is not None, ascii(host)
    assert DEFAULT.check_url(f"http://{host}:8443/path") is not None, ascii(host)


@given(spellings())
def test_registration_reads_a_host_as_the_executors_url_parser_does(
    spelling: tuple[str, ipaddress.IPv4Address],
) -> None:
    # The HTTP executor calls yarl's URL: its host, decided again at call time, is the host
    # registration decided.
    host, address = spelling
    assert parse_host(URL(f"http://{host}/").raw_host or "") == address, ascii(host)


# Any host from characters a spelling may hold, digits of other scripts (which NFKC leaves
# alone: names, not numbers) and letters: where registration reads an address or a name,
# the executor's URL parser reads the same one.
HOST_CHARS = [*(f for forms in DIGITS.values() for f in forms), *DOTS, "\u0661", "\u0967"]
HOST_CHARS += [*(f for forms in OTHERS.values() for f in forms), "k", "\u00e9", "-"]


@given(st.text(st.sampled_from(HOST_CHARS), min_size=1, max_size=24))
def test_any_host_is_read_as_the_executors_url_parser_reads_it(host: str) -> None:
    try:
        registered = parse_host(host)
    except ValueError:
        return  # refused at registration: never called
    try:
        called = URL(f"http://{host}/").raw_host or ""
    except ValueError:
        return  # the executor cannot call it either
    assert parse_host(called) == registered, ascii(host)


@pytest.mark.parametrize("host", UNSPECIFIED_SPELLINGS)
def test_the_unspecified_address_is_refused_whatever_is_allowed(host: str) -> None:
    # Connecting to 0.0.0.0 reaches this machine on Linux.
    everything = EgressPolicy.build(allow=["0.0.0.0/0", "::/0"])
    for policy in (DEFAULT, LOOPBACK, everything):
        assert policy.check_url(f"http://{host}:8080/") is not None, host


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("METADATA.GOOGLE.INTERNAL", "metadata.google.internal"),
        ("metadata.google.internal.", "metadata.google.internal"),
        ("Metadata.Goog", "metadata.goog"),
        (FULL_WIDTH_METADATA, "metadata.google.internal"),
        ("b\u00fccher.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example.", "xn--bcher-kva.example"),
        ("deadbeef", "deadbeef"),  # hex digits without 0x are a name, as getaddrinfo reads them
        ("0x1.com", "0x1.com"),
        ("1.2.3.4.5", "1.2.3.4.5"),
    ],
)
def test_host_names_are_lower_case_ascii_without_the_trailing_dot(host: str, name: str) -> None:
    assert parse_host(host) == name


@pytest.mark.parametrize(
    "host",
    [
        "metadata.google.internal",
        "METADATA.google.internal.",
        FULL_WIDTH_METADATA,
        "metadata.goog",
        "metadata",
        "instance-data",
    ],
)
def test_metadata_host_names_are_refused_in_every_form(host: str) -> None:
    everything = EgressPolicy.build(allow=["*.internal", "*.goog", "metadata"])
    for policy in (DEFAULT, everything):
        reason = policy.check_url(f"http://{host}/computeMetadata/v1/")
        assert reason is not None and "metadata" in reason, host


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # shared address space (carrier-grade NAT)
        "169.254.1.1",
        "[fe80::1]",
        "[fe80::1%25eth0]",
        "[fd12:3456::1]",
        "[fec0::1]",
        "198.18.0.1",
        "240.0.0.1",
        "[64:ff9b::a9fe:a9fe]",  # NAT64 to the metadata address
        "[64:ff9b::a00:1]",  # NAT64 to 10.0.0.1
        "[2002:a9fe:a9fe::1]",  # 6to4 carrying the metadata address
        "[::a9fe:a9fe]",  # IPv4-compatible
    ],
)
def test_private_link_local_and_embedding_addresses_are_refused_by_default(address: str) -> None:
    assert DEFAULT.check_url(f"https://{address}/") is not None, address


@pytest.mark.parametrize(
    "address", ["224.0.0.1", "239.255.255.250", "[ff02::1]", "255.255.255.255"]
)
def test_multicast_and_broadcast_are_refused_whatever_is_allowed(address: str) -> None:
    everything = EgressPolicy.build(allow=["0.0.0.0/0", "::/0"])
    assert everything.check_url(f"http://{address}/") is not None


@pytest.mark.parametrize(
    "url",
    [
        "https://93.184.215.14/hook",
        "https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/hook",
        "https://[::ffff:93.184.215.14]/hook",
        "https://api.example.com/hook",
        "https://api.example.com.:8443/hook",
        "http://b\u00fccher.example/",
    ],
)
def test_public_addresses_and_names_pass(url: str) -> None:
    assert DEFAULT.check_url(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://user:pw@api.example.com/", "credentials"),
        ("http://api.example.com@10.0.0.1/", "credentials"),
        ("http://api.example.com:99999/", "cannot be read"),
        ("http://%31%32%37.0.0.1/", "host name"),
        ("http://exa mple.com/", "white space"),
        ("http://[::1/", "cannot be read"),
        ("http://127.0.0.1\t.example.com/", "white space"),
        ("http://api.example.com\n@127.0.0.1/", "white space"),
        ("http://api.example.com/\x00", "control characters"),
    ],
)
def test_urls_that_hide_their_host_are_refused(url: str, says: str) -> None:
    reason = DEFAULT.check_url(url)
    assert reason is not None and says in reason, reason


def test_an_allow_list_entry_may_name_one_port() -> None:
    policy = EgressPolicy.build(allow=["127.0.0.1:9000", "[::1]:9000"])
    assert policy.check_url("http://127.0.0.1:9000/hook") is None
    assert policy.check_url("http://[::1]:9000/hook") is None
    assert policy.check_url("http://127.0.0.1:22/") is not None
    assert policy.check_url("http://[::1]:22/") is not None
    assert policy.check_url("http://127.0.0.2:9000/") is not None


def test_the_operator_denies_before_allowing_and_by_name_or_address() -> None:
    policy = EgressPolicy.build(
        allow=["10.0.0.0/8", "*.svc.internal"],
        deny=["10.9.0.0/16", "secrets.svc.internal", "*.example.org:443"],
    )
    assert policy.check_url("http://10.1.0.1/") is None
    reason = policy.check_url("http://10.9.0.1/")
    assert reason is not None and "10.9.0.0/16" in reason
    assert policy.check_url("http://secrets.svc.internal/") is not None
    assert policy.check_url("https://www.example.org/") is not None
    assert policy.check_url("http://www.example.org/") is None  # port 80 is not denied


def test_an_allowed_host_name_may_resolve_to_a_private_address_but_never_to_metadata() -> None:
    policy = EgressPolicy.build(allow=["*.svc.internal"])
    private = ipaddress.ip_address("10.0.0.7")
    assert policy.check_address(private, 443, "billing.svc.internal") is None
    assert policy.check_address(private, 443, "elsewhere.example") is not None
    assert policy.check_address(METADATA_V4, 80, "billing.svc.internal") is not None
    # A pattern matches the names under it, not the domain itself.
    assert policy.check_address(private, 443, "svc.internal") is not None


def test_this_nodes_api_is_refused_on_every_local_address_even_when_loopback_is_allowed() -> None:
    local = {ipaddress.ip_address("192.0.2.10")}  # the node's own interface, as the node says
    policy = EgressPolicy.build(
        allow=["127.0.0.0/8", "::1", "192.0.2.0/24"],
        own_ports=[8080],
        is_local=lambda a: a.is_loopback or a in local,
    )
    for url in (
        "http://127.0.0.1:8080/v1/jobs",
        "http://127.0.0.53:8080/",
        "http://[::1]:8080/",
        "http://[::ffff:127.0.0.1]:8080/",
        "http://localhost:8080/",
        "http://192.0.2.10:8080/metrics",
    ):
        reason = policy.check_url(url)
        assert reason is not None and "this node" in reason, url
    assert policy.check_url("http://127.0.0.1:9000/") is None
    assert policy.check_url("http://192.0.2.11:8080/") is None  # another machine's 8080


def test_the_clusters_kafka_brokers_are_never_reachable() -> None:
    policy = EgressPolicy.build(allow=["10.0.0.0/8", "*.internal"], never=["10.0.0.5:9092"])
    assert policy.check_url("http://10.0.0.5:9092/") is not None
    assert policy.check_url("http://10.0.0.5:8080/") is None
    named = EgressPolicy.build(allow=["*.internal"], never=["kafka.internal:9092"])
    assert named.check_url("http://kafka.internal:9092/") is not None


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("10.0.0.0/8", Rule("10.0.0.0/8", network=ipaddress.ip_network("10.0.0.0/8"))),
        ("10.0.0.1/8", Rule("10.0.0.1/8", network=ipaddress.ip_network("10.0.0.0/8"))),
        ("127.1", Rule("127.1", network=ipaddress.ip_network("127.0.0.1/32"))),
        (
            "::ffff:10.0.0.0/104",
            Rule("::ffff:10.0.0.0/104", network=ipaddress.ip_network("10.0.0.0/8")),
        ),
        (
            "[fd00::/8]:443",
            Rule("[fd00::/8]:443", network=ipaddress.ip_network("fd00::/8"), port=443),
        ),
        ("API.Example.com.:8443", Rule("API.Example.com.:8443", name="api.example.com", port=8443)),
        ("*.svc.internal", Rule("*.svc.internal", name="svc.internal", wildcard=True)),
    ],
)
def test_rules_read_addresses_ranges_names_patterns_and_ports(text: str, rule: Rule) -> None:
    assert Rule.parse(text) == rule


@pytest.mark.parametrize("text", ["", "10.0.0.0/8:0", "a.b:http", "[::1", "*.", "exa mple.com"])
def test_a_rule_that_cannot_be_read_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        Rule.parse(text)


def test_comma_separated_entries_are_read_one_by_one() -> None:
    policy = EgressPolicy.build(allow=["127.0.0.0/8, ::1", "10.0.0.0/8"])
    assert [r.text for r in policy.allow] == ["127.0.0.0/8", "::1", "10.0.0.0/8"]


# -- Kafka topics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "cronlog.events",
        "cronlog.commands",
        "cronlog.replies",
        "cronlog.anything-new",
        "cronlog_events",  # Kafka lets "." and "_" collide
        "__consumer_offsets",
        "__transaction_state",
        "__anything",
    ],
)
def test_the_clusters_own_and_kafkas_internal_topics_are_never_granted(topic: str) -> None:
    everything = EgressPolicy.build(topics=["*=*"])
    for tenant in ("team-a", "cronlog"):
        reason = everything.check_topic(tenant, topic)
        assert reason is not None and "topic" in reason, topic


def test_a_clusters_own_topics_follow_its_prefix() -> None:
    policy = EgressPolicy.build(topics=["*=*"], topic_prefix="prod_p")
    assert policy.check_topic("team-a", "prod_p.events") is not None
    assert policy.check_topic("team-a", "prod.p.events") is not None
    assert policy.check_topic("team-a", "cronlog.events") is None


def test_topics_are_granted_per_team_by_prefix() -> None:
    policy = EgressPolicy.build(topics=["team-a=billing.,team-a=audit.", "*={tenant}."])
    assert policy.check_topic("team-a", "billing.invoices") is None
    assert policy.check_topic("team-a", "team-a.results") is None
    assert policy.check_topic("team-b", "team-b.results") is None
    assert policy.check_topic("team-b", "billing.invoices") is not None
    assert policy.check_topic("team-b", "team-a.results") is not None


def test_no_topic_is_granted_unless_the_operator_says_so() -> None:
    reason = DEFAULT.check_topic("team-a", "results")
    assert reason is not None and "--allow-topics" in reason


@pytest.mark.parametrize("text", ["team-a", "=x", "team-a=", " = "])
def test_a_topic_grant_that_cannot_be_read_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        TopicGrant.parse(text)


# -- targets -----------------------------------------------------------------------------------


def test_a_refused_target_is_an_invalid_definition_of_target_saying_egress_policy() -> None:
    with pytest.raises(EgressDenied) as denied:
        DEFAULT.check_target("team-a", HttpTarget(url="http://0xa9fea9fe/"))
    assert isinstance(denied.value, InvalidDefinition)
    assert denied.value.field == "target"
    assert denied.value.message.startswith("egress policy: ")
    with pytest.raises(EgressDenied):
        DEFAULT.check_target("team-a", KafkaTarget(topic="cronlog.events"))
    DEFAULT.check_target("team-a", PullTarget(pool="p"))  # workers come to cronlog


class CronTarget(msgspec.Struct, frozen=True, tag="cron"):
    """A kind the policy has never heard of (one added to ``Target`` and not to the policy)."""

    url: str


def test_a_target_of_a_kind_the_policy_does_not_know_is_refused() -> None:
    everything = EgressPolicy.build(allow=["0.0.0.0/0", "::/0"], topics=["*=*"])
    with pytest.raises(EgressDenied) as denied:
        everything.check_target("team-a", CronTarget(url="http://93.184.215.14/"))  # type: ignore[arg-type]
    assert denied.value.field == "target"
    assert "CronTarget" in denied.value.message


def test_the_startup_line_says_what_is_allowed() -> None:
    line = EgressPolicy.build(allow=["127.0.0.0/8"], topics=["*={tenant}."]).describe()
    assert "127.0.0.0/8" in line and "*={tenant}." in line
    assert "kafka:// targets are refused" in DEFAULT.describe()
