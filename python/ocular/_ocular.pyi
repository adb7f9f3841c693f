"""The native half of the recorder (ocular-record, built by maturin). Internal: use ``ocular.record``."""

from os import PathLike
from types import CodeType
from typing import Any, Callable

TSC: bool
callbacks: dict[str, Callable[..., Any]]
callbacks_gapless: dict[str, Callable[..., Any]]
FAST_INTS: bool
bench_callbacks: dict[str, Callable[..., Any]]

def ticks() -> int: ...
def ticks_per_second(window_ms: int) -> float: ...
def clock_point() -> tuple[int, int, int]: ...
def start(
    path: str | PathLike[str] | None,
    header: dict[str, Any],
    mode: str,
    threshold: int,
    include_only: list[str],
    exclude: list[str],
    buffer_events: int,
    max_buffers: int,
    event_cost_ticks: float,
    thread_name: Callable[[], str],
    boot_code: CodeType,
    main_native_id: int,
    main_name: str,
    internal: list[str],
    calibration: list[tuple[int, float]] = ...,
) -> None: ...
def stop(names: dict[int, str]) -> dict[str, Any]: ...
def abandon_after_fork() -> None: ...
def is_recording() -> bool: ...
def start_windows(period: float, length: float, main_ident: int) -> None: ...
def read(path: str | PathLike[str], salvage: bool = False) -> dict[str, Any]: ...
