"""A process that retains freed memory reuses chunk-sized buffers instead of faulting their
pages in again (`services.common.malloc_tuning`); 0 leaves glibc's defaults alone; a bad
`SERENTAK_MALLOC_RETAIN_BYTES` stops the start, naming it.

Each allocator case runs in a fresh interpreter: the setting is process-wide, and the
count of page faults must not depend on what this test process allocated before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.config import CommonSettings, load

REPO = Path(__file__).resolve().parents[2]

# Four 4 MiB copies alive at once, then freed, 32 times over: what 4 parallel PutChunk
# calls do to the upload process's heap. Prints whether the setting applied and the
# minor page faults per round.
ROUNDS = f"""
import json, resource, sys
sys.path.insert(0, {str(REPO)!r})
from services.common.malloc_tuning import retain_freed_memory
applied = retain_freed_memory(int(sys.argv[1]))
source = memoryview(bytes(4 << 20))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(32):
    copies = [bytes(source) for _ in range(4)]
    del copies
print(json.dumps({{"applied": applied, "faults_per_round": (faults() - before) / 32}}))
"""


def rounds(retain: int) -> dict[str, float]:
    """Run ROUNDS in a new interpreter with `retain`; its report."""
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, str(retain)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_retained_freed_memory_serves_the_next_chunk_buffers_without_faulting_them_in() -> None:
    default = rounds(0)
    retained = rounds(256 * 1024 * 1024)
    assert default["applied"] is False
    assert retained["applied"] is True
    # glibc's defaults: every round maps (faults in) most of its 4 x 1,024 pages again.
    assert default["faults_per_round"] > 2 * 1024
    # Retained: the first round's pages serve every later one.
    assert retained["faults_per_round"] < default["faults_per_round"] / 10


def test_malloc_retain_bytes_defaults_on_and_a_bad_value_stops_the_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load(CommonSettings).malloc_retain_bytes == 256 * 1024 * 1024
    monkeypatch.setenv("SERENTAK_MALLOC_RETAIN_BYTES", "0")
    assert load(CommonSettings).malloc_retain_bytes == 0
    for bad in ("-1", "lots", str(2**31)):
        monkeypatch.setenv("SERENTAK_MALLOC_RETAIN_BYTES", bad)
        with pytest.raises(ValidationError, match="malloc_retain_bytes"):
            load(CommonSettings)
