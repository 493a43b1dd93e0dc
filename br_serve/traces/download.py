"""Download the public originals of the supported traces (for users with internet).

Tests never call this. Files land in ``dest/<name>/``; an existing file is kept unless
``force``. Each source is listed with its licence: check it before use.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    url: str
    filename: str
    licence: str


SOURCES: tuple[Source, ...] = (
    Source("azure2023-code", "https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
           "master/data/AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_code.csv",
           "CC-BY-4.0 (cite Splitwise, ISCA'24)"),
    Source("azure2023-conv", "https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
           "master/data/AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_conv.csv",
           "CC-BY-4.0 (cite Splitwise, ISCA'24)"),
    Source("azure2024-code", "https://azurepublicdatasettraces.blob.core.windows.net/"
           "azurellminfererencetrace/AzureLLMInferenceTrace_code_1week.csv",
           "AzureLLMInferenceTrace_code_1week.csv", "CC-BY-4.0 (cite DynamoLLM)"),
    Source("azure2024-conv", "https://azurepublicdatasettraces.blob.core.windows.net/"
           "azurellminfererencetrace/AzureLLMInferenceTrace_conv_1week.csv",
           "AzureLLMInferenceTrace_conv_1week.csv", "CC-BY-4.0 (cite DynamoLLM)"),
    Source("mooncake-conversation", "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
           "main/FAST25-release/traces/conversation_trace.jsonl", "conversation_trace.jsonl",
           "Apache-2.0 (kvcache-ai/Mooncake)"),
    Source("mooncake-synthetic", "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
           "main/FAST25-release/traces/synthetic_trace.jsonl", "synthetic_trace.jsonl",
           "Apache-2.0 (kvcache-ai/Mooncake)"),
    Source("burstgpt", "https://raw.githubusercontent.com/HPMLL/BurstGPT/main/data/"
           "BurstGPT_1.csv", "BurstGPT_1.csv", "CC-BY-4.0 (HPMLL/BurstGPT)"),
)


def source(name: str) -> Source:
    """Look a source up by name. Raises ValueError listing the known names."""
    for s in SOURCES:
        if s.name == name:
            return s
    raise ValueError(f"trace: unknown source {name!r}; known: "
                     f"{', '.join(s.name for s in SOURCES)}")


def download(name: str, dest: str | Path, *, force: bool = False,
             timeout_s: float = 60.0) -> Path:
    """Fetch source ``name`` into ``dest/name/filename`` and return that path.

    The file is written to a ``.part`` file first and renamed when complete, so an
    interrupted download never leaves a truncated trace behind.
    """
    src = source(name)
    out_dir = Path(dest) / src.name
    out = out_dir / src.filename
    if out.exists() and not force:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(out.suffix + ".part")
    with urllib.request.urlopen(src.url, timeout=timeout_s) as resp, part.open("wb") as fh:
        while chunk := resp.read(1 << 20):
            fh.write(chunk)
    part.replace(out)
    return out
