"""A fake Kafka broker that answers one kind of admin request with a body librdkafka cannot parse.

It speaks just enough of the Kafka protocol for librdkafka 2.16 to reach the request under test:
``ApiVersions`` (any version, the flexible v3 librdkafka sends first included) and ``Metadata``
(one broker, itself, node id 1 and the controller; no topics). The request of the api key it is
given (``DescribeAcls``, ``CreateAcls``, ``DeleteAcls`` or ``ListGroups``) gets an answer with a
correct size prefix and correlation id whose body ends right after its error code (or throttle
time): librdkafka's parser of that answer then fails a read (buffer underflow) and, through its
own bugs, takes the whole process with it (see :data:`MALFORMED`). Any other request goes
unanswered.

Only versions whose requests and answers are not flexible are offered, except ``ApiVersions``:
``Metadata`` 1-8, ``ListGroups`` 0-2 and the ACL requests 0-1.

    with MalformedBroker(DESCRIBE_ACLS) as broker:
        client = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept while it waits
        client.describe_acls(...).result()  # SIGABRT
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

API_VERSIONS = 18
METADATA = 3
LIST_GROUPS = 16
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31

NODE_ID = 1

SUPPORTED = {  # api key -> (lowest, highest) version offered
    API_VERSIONS: (0, 3),
    METADATA: (1, 8),
    LIST_GROUPS: (0, 2),
    DESCRIBE_ACLS: (0, 1),
    CREATE_ACLS: (0, 1),
    DELETE_ACLS: (0, 1),
}

_THROTTLE_TIME = struct.pack(">i", 0)
_NO_ERROR = struct.pack(">h", 0)

MALFORMED = {  # api key -> the body of its answer at a version: cut short
    # rd_kafka_DescribeAclsResponse_parse reads the throttle time and the error code, then fails
    # to read the error message; its err_parse path returns its local ``err``, still NO_ERROR,
    # with no result, and rd_kafka_admin_response_parse fails rd_assert(rko_result): SIGABRT.
    DESCRIBE_ACLS: lambda version: _THROTTLE_TIME + _NO_ERROR,
    # The same in rd_kafka_CreateAclsResponse_parse and rd_kafka_DeleteAclsResponse_parse, which
    # fail to read their array's count right after the throttle time.
    CREATE_ACLS: lambda version: _THROTTLE_TIME,
    DELETE_ACLS: lambda version: _THROTTLE_TIME,
    # rd_kafka_ListConsumerGroupsResponse_parse fails to read the groups' count after the error
    # code (and v1+'s throttle time), before it made its lists and its result; its err_parse path
    # adds the parse error to the uninitialised list and the result to the NULL result op:
    # SIGSEGV, in librdkafka's own thread.
    LIST_GROUPS: lambda version: (_THROTTLE_TIME if version >= 1 else b"") + _NO_ERROR,
}


def _string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def api_versions_body(version: int) -> bytes:
    """The body of an ``ApiVersions`` answer at ``version`` offering :data:`SUPPORTED`."""
    flexible = version >= 3
    entries = b"".join(
        struct.pack(">hhh", key, low, high) + (b"\x00" if flexible else b"")
        for key, (low, high) in sorted(SUPPORTED.items())
    )
    # A compact array (flexible versions) counts its entries + 1.
    count = _uvarint(len(SUPPORTED) + 1) if flexible else struct.pack(">i", len(SUPPORTED))
    body = _NO_ERROR + count + entries
    if version >= 1:
        body += _THROTTLE_TIME
    if flexible:
        body += b"\x00"  # no tagged fields
    return body


def metadata_body(version: int, port: int) -> bytes:
    """The body of a ``Metadata`` answer at ``version`` (1-8): this broker alone, no topics."""
    body = _THROTTLE_TIME if version >= 3 else b""
    body += struct.pack(">i", 1)  # one broker
    body += struct.pack(">i", NODE_ID) + _string("127.0.0.1") + struct.pack(">i", port)
    body += _string(None)  # rack
    if version >= 2:
        body += _string("malformed-broker")  # cluster id
    body += struct.pack(">i", NODE_ID)  # controller id
    body += struct.pack(">i", 0)  # no topics
    if version >= 8:
        body += struct.pack(">i", -(2**31))  # cluster authorized operations: not asked
    return body


def _read_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class MalformedBroker:
    """A fake broker on 127.0.0.1 (a free port) that answers the requests of ``malformed`` (an
    api key of :data:`MALFORMED`) with a body librdkafka crashes on; a context manager.

    ``bootstrap`` is its address for ``bootstrap.servers``; ``requests`` lists the
    ``(api key, version)`` of each request received, ``malformed_sent`` is set once a malformed
    answer has gone out."""

    def __init__(self, malformed: int = DESCRIBE_ACLS) -> None:
        if malformed not in MALFORMED:
            raise ValueError(f"no malformed answer for api key {malformed}")
        self.malformed = malformed
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.requests: list[tuple[int, int]] = []
        self.malformed_sent = threading.Event()
        self._stopping = threading.Event()
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="malformed-broker", daemon=True)

    def __enter__(self) -> MalformedBroker:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._connections.clear()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                if self._stopping.is_set():
                    conn.close()
                    return
                self._connections.append(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="malformed-broker-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                size = _read_exactly(conn, 4)
                if size is None:
                    return
                request = _read_exactly(conn, struct.unpack(">i", size)[0])
                if request is None:
                    return
                api_key, version, correlation_id = struct.unpack(">hhi", request[:8])
                with self._lock:
                    self.requests.append((api_key, version))
                body = self._answer(api_key, version)
                if body is None:
                    continue  # unknown here: librdkafka times it out
                # Response header v0 (the correlation id alone): no version offered is flexible,
                # and ApiVersions answers always use v0.
                frame = struct.pack(">i", correlation_id) + body
                conn.sendall(struct.pack(">i", len(frame)) + frame)
                if api_key == self.malformed:
                    self.malformed_sent.set()

    def _answer(self, api_key: int, version: int) -> bytes | None:
        if api_key == API_VERSIONS:
            return api_versions_body(version)
        if api_key == METADATA:
            return metadata_body(version, self.port)
        if api_key == self.malformed:
            return MALFORMED[api_key](version)
        return None
