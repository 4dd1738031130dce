"""Where `LLMEngine`'s model comes from: given, loaded on one device, or (tensor parallel) rank 0's shard with
the other ranks started."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphpool.engine.config import EngineConfig
from graphpool.engine.tp_rank import LoadedModel, load_model_for, load_shard
from graphpool.pool.capture import Capturer

if TYPE_CHECKING:
    from graphpool.engine.tp_leader import TPLeader


def load_for_engine(config: EngineConfig, loaded: LoadedModel | None,
                    capturer: Capturer | None) -> tuple[TPLeader | None, LoadedModel]:
    """Rank 0's model for `LLMEngine`: `loaded` as given, or loaded here; with tensor_parallel_size > 1 the
    other ranks are started first (their leader comes back with this rank's shard)."""
    if config.tensor_parallel_size == 1:
        return None, loaded if loaded is not None else load_model_for(config, config.torch_device)
    from graphpool.engine.tp_leader import TPLeader

    if loaded is not None:
        raise ValueError("tensor_parallel_size > 1 loads the model on every rank: `loaded` cannot be used")
    leader = TPLeader(config, capturer)
    try:
        shard = load_shard(config, leader.tp)
        leader.wait_for("loaded")
    except BaseException:
        leader.close()
        raise
    return leader, shard
