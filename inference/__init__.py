"""chatui's inference engine: checkpoints, chat encoding, KV-cache decoding, sampling,
logprobs, incremental detokenization and the async worker. Never imports the UI."""

from .settings import SamplingParams, SettingsError, parse_assignments
from .types import (
    Alternative,
    AssistantPrefix,
    Event,
    Failed,
    GenerationRequest,
    Message,
    ModelInfo,
    Progress,
    RowDone,
    Started,
    Token,
    TokenBatch,
    Usage,
)
from .worker import GenerationStream, InferenceWorker

__all__ = [
    "Alternative", "AssistantPrefix", "Event", "Failed", "GenerationRequest", "GenerationStream",
    "InferenceWorker", "Message", "ModelInfo", "Progress", "RowDone", "SamplingParams",
    "SettingsError", "Started", "Token", "TokenBatch", "Usage", "parse_assignments",
]
