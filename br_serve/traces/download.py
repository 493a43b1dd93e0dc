"""Download the public originals of the supported traces (for users with internet).

Tests never call the network. A source lands in ``dest/<directory>/<filename>`` under
the original file name, e.g. ``traces/mooncake/conversation_trace.jsonl`` for
``mooncake-conversation`` (so ``br-serve sim --trace traces/mooncake/...`` finds it).
An existing file is kept unless ``force``. Each source is listed with its licence:
check it before use.

Failures (no network, HTTP errors, a disk error) raise :class:`DownloadError` with a
one-line message naming the source and URL, and leave nothing behind: no partial
file, no directory this call created.
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class DownloadError(RuntimeError):
    """A download failed; the message is one line naming the source and the reason."""


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    url: str
    filename: str
    licence: str
    directory: str = ""  # under ``dest``; defaults to ``name``

    @property
    def subdir(self) -> str:
        return self.directory or self.name


SOURCES: tuple[Source, ...] = (
    Source("azure2023-code", "https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
           "master/data/AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_code.csv",
           "CC-BY-4.0 (cite Splitwise, ISCA'24)", "azure2023"),
    Source("azure2023-conv", "https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
           "master/data/AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_conv.csv",
           "CC-BY-4.0 (cite Splitwise, ISCA'24)", "azure2023"),
    Source("azure2024-code", "https://azurepublicdatasettraces.blob.core.windows.net/"
           "azurellminfererencetrace/AzureLLMInferenceTrace_code_1week.csv",
           "AzureLLMInferenceTrace_code_1week.csv", "CC-BY-4.0 (cite DynamoLLM)", "azure2024"),
    Source("azure2024-conv", "https://azurepublicdatasettraces.blob.core.windows.net/"
           "azurellminfererencetrace/AzureLLMInferenceTrace_conv_1week.csv",
           "AzureLLMInferenceTrace_conv_1week.csv", "CC-BY-4.0 (cite DynamoLLM)", "azure2024"),
    Source("mooncake-conversation", "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
           "main/FAST25-release/traces/conversation_trace.jsonl", "conversation_trace.jsonl",
           "Apache-2.0 (kvcache-ai/Mooncake)", "mooncake"),
    Source("mooncake-synthetic", "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
           "main/FAST25-release/traces/synthetic_trace.jsonl", "synthetic_trace.jsonl",
           "Apache-2.0 (kvcache-ai/Mooncake)", "mooncake"),
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


def target(name: str, dest: str | Path) -> Path:
    """Where :func:`download` puts source ``name`` under ``dest``."""
    src = source(name)
    return Path(dest) / src.subdir / src.filename


def download(name: str, dest: str | Path, *, force: bool = False,
             timeout_s: float = 60.0) -> Path:
    """Fetch source ``name`` into :func:`target` and return that path.

    The file is written to a ``.part`` file first and renamed when complete, so an
    interrupted download never leaves a truncated trace behind.

    Raises:
        ValueError: unknown source name.
        DownloadError: the download failed (see the module docstring).
    """
    src = source(name)
    out = target(name, dest)
    if out.exists() and not force:
        return out
    created = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    part = out.with_suffix(out.suffix + ".part")
    try:
        with urllib.request.urlopen(src.url, timeout=timeout_s) as resp:
            out.parent.mkdir(parents=True, exist_ok=True)
            with part.open("wb") as fh:
                while chunk := resp.read(1 << 20):
                    fh.write(chunk)
        part.replace(out)
    except (urllib.error.URLError, OSError, ValueError) as exc:  # timeouts are OSErrors
        part.unlink(missing_ok=True)
        for d in created:  # innermost first; only what this call made, only if empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise DownloadError(f"cannot download {name} from {src.url}: {_reason(exc)} "
                            f"(needs internet; or put the file at {out} yourself)") from None
    return out


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__
