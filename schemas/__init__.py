"""Typed events: the contract between stages. Import events from here."""
from schemas.admission import RequestAdmitted, RequestRefused
from schemas.base import Event, id_time, id_time_ms, new_id
from schemas.codec import ALL_EVENTS, decode, decode_record, encode, keyless
from schemas.deadletter import EventDeadLettered
from schemas.deletion import ConversationDeleted, ConversationPurged
from schemas.errors import EventDecodeError, MalformedEvent, UnsupportedVersion
from schemas.gateway import CancelRequested, MessageSubmitted, own_client_message_id
from schemas.generation import GenerationFinished, GenerationStarted, TokensAppended, Usage
from schemas.prompt import PoolPrompt, PromptBuilt
from schemas.safety import Block, GenerationRetracted, InputBlocked
from schemas.scheduler import GenerationQueued, GenerationRequested
from schemas.settlement import UsageRecorded

__all__ = [
    "ALL_EVENTS", "Block", "CancelRequested", "ConversationDeleted", "ConversationPurged", "Event",
    "EventDeadLettered", "EventDecodeError", "GenerationFinished", "GenerationQueued", "GenerationRequested",
    "GenerationRetracted", "GenerationStarted", "InputBlocked", "MalformedEvent", "MessageSubmitted", "PoolPrompt",
    "PromptBuilt",
    "RequestAdmitted", "RequestRefused", "TokensAppended", "UnsupportedVersion", "Usage", "UsageRecorded", "decode",
    "decode_record", "keyless",
    "encode", "id_time", "id_time_ms", "new_id", "own_client_message_id",
]
