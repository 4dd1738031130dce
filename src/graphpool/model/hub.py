"""Hugging Face hub ids (`org/name[@revision]`) as model folders: `huggingface_hub.snapshot_download` fetches
only what the loader reads (config, generation config, tokenizer, safetensors) into the hub cache (HF_HOME,
or `download_dir`), and answers from that cache alone in offline mode (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# what the loader reads from a model repository; never *.bin, *.pt or *.gguf weights
ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)
# owner/name as the hub spells them (letters, digits, '-', '_', '.'), then an optional @revision
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None


def parse_hub_id(name: str) -> HubRef | None:
    """`org/name` or `org/name@revision` -> HubRef; anything else (a path, a preset) -> None."""
    m = _HUB_ID.match(name)
    if m is None or name.startswith((".", "/", "~")):
        return None
    return HubRef(m["repo"], m["rev"])


def hub_snapshot(ref: HubRef, revision: str | None = None, download_dir: str | None = None) -> Path:
    """The local folder of `ref` (downloading what is missing unless offline); one clear ValueError when the
    repository, the revision or a file cannot be had."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if ref.revision is not None and revision is not None and ref.revision != revision:
        raise ValueError(f"model {ref.repo_id}@{ref.revision} and revision {revision!r} disagree: give one")
    rev = ref.revision or revision
    what = f"{ref.repo_id}" + (f"@{rev}" if rev else "")
    try:
        folder = Path(snapshot_download(ref.repo_id, revision=rev, cache_dir=download_dir,
                                        allow_patterns=list(ALLOW_PATTERNS)))
    except LocalEntryNotFoundError as exc:
        raise ValueError(f"model {what!r} is not in the Hugging Face cache and the hub cannot be reached "
                         f"(offline, or no network): download it once with network, or pass a local folder "
                         f"({type(exc).__name__})") from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ValueError(f"model {what!r}: no such repository on the Hugging Face hub, or it is gated/private "
                         f"and needs a token (HF_TOKEN)") from exc
    except RevisionNotFoundError as exc:
        raise ValueError(f"model {what!r}: the hub has no revision {rev!r}") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ValueError(f"model {what!r}: could not fetch it from the Hugging Face hub: {exc}") from exc
    if not (folder / "config.json").is_file():
        raise ValueError(f"model {what!r} has no config.json: not a transformers model repository")
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"model {what!r} has no *.safetensors weights (graphpool reads safetensors only)")
    return folder
