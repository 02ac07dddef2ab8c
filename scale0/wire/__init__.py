"""Bytes: S0P/1 frames to typed messages and back; pure, validates every untrusted frame.

Entry points (docs/protocol.md): :func:`decode_to_broker`, :func:`decode_from_broker`,
:func:`encode`, :func:`decode_config_publication`; the only exception is :class:`ProtocolError`.
"""

from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    ClientRequest,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.configsync import PublishedConfig, decode_config_publication
from scale0.wire.errors import ProtocolError
from scale0.wire.frames import (
    RESERVED_SERVICE_PREFIXES,
    SIG_BROKER,
    SIG_CLIENT,
    SIG_WORKER,
    ConfigType,
    Message,
    is_reserved_service,
)
from scale0.wire.peer import (
    BrokerState,
    Forward,
    ForwardPartial,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
    TableService,
    TableWorker,
)
from scale0.wire.registry import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    PEER_SIGNATURES,
    Direction,
    decode_from_broker,
    decode_to_broker,
    encode,
)
from scale0.wire.worker import Ready, WorkerPartial, WorkerReply, WorkerRequest

__all__ = [
    "BACKEND_SIGNATURES",
    "FRONTEND_SIGNATURES",
    "PEER_SIGNATURES",
    "RESERVED_SERVICE_PREFIXES",
    "SIG_BROKER",
    "SIG_CLIENT",
    "SIG_WORKER",
    "BrokerState",
    "CheckConfig",
    "ClientPartial",
    "ClientReply",
    "ClientRequest",
    "Config",
    "ConfigAck",
    "ConfigType",
    "Direction",
    "Disconnect",
    "DisconnectError",
    "ForceNegotiate",
    "Forward",
    "ForwardPartial",
    "ForwardReply",
    "Heartbeat",
    "Hello",
    "ManagementReply",
    "ManagementRequest",
    "Message",
    "PeerHeartbeat",
    "ProtocolError",
    "PublishedConfig",
    "Ready",
    "Table",
    "TableMode",
    "TableReq",
    "TableService",
    "TableWorker",
    "WorkerPartial",
    "WorkerReply",
    "WorkerRequest",
    "decode_config_publication",
    "decode_from_broker",
    "decode_to_broker",
    "encode",
    "is_reserved_service",
]
