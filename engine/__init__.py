"""ServeLab's inference engine: a real paged-KV, continuous-batching engine, steppable."""

from engine.config import EngineConfig, SamplingParams, SpecConfig
from engine.engine import LLMEngine, RequestOutput
from engine.report import StepReport

__all__ = ["LLMEngine", "EngineConfig", "SamplingParams", "SpecConfig", "RequestOutput",
           "StepReport"]
