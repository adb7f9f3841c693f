"""OpenTelemetry: every span the SDK starts, written into the recording where it runs (FORMAT.md 5.9), with
its trace id and span id, so that ``ocular spans`` breaks each request down by function and names the
trace it belongs to.

    from opentelemetry.sdk.trace import TracerProvider
    import ocular.otel

    provider = TracerProvider()
    provider.add_span_processor(ocular.otel.SpanProcessor())

Needs ``opentelemetry-sdk`` (imported only by this module). While nothing records, the processor writes
nothing and costs a call per span start and end.
"""

from __future__ import annotations

from typing import Any

from . import _ocular, _spans
from .errors import MissingDependency

try:
    from opentelemetry.sdk.trace import SpanProcessor as _SpanProcessor
except ImportError as e:  # pragma: no cover - the message is the point
    raise MissingDependency("ocular.otel needs opentelemetry-sdk: pip install opentelemetry-sdk") from e

__all__ = ["SpanProcessor"]


class SpanProcessor(_SpanProcessor):
    """Writes each span's start and end into the current recording: its name, trace id, span id, parent
    span id and attributes at the start; its status and the attributes set since at the end. Add it to a
    ``TracerProvider`` with ``add_span_processor``; it exports nothing, so it goes beside the exporters."""

    def __init__(self) -> None:
        # Open spans: OpenTelemetry span id -> (Ocular's key, the attributes it began with, the token that
        # made it the enclosing span of what runs next in its context).
        self._open: dict[int, tuple[int, dict[str, Any], Any]] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        ctx = span.get_span_context()
        parent = span.parent
        # The SDK's attributes are a locked mapping behind a proxy: copied once (a dict), and only if any.
        attrs = span.attributes
        begun = attrs.copy() if attrs else None
        # The enclosing span of this recording: the OpenTelemetry parent, if it was recorded here, or the
        # `ocular.span` around this code.
        entry = self._open.get(parent.span_id) if parent is not None else None
        key = _ocular.span_begin(
            span.name,
            _spans.attributes(begun) if begun else [],
            ctx.trace_id,
            ctx.span_id,
            parent.span_id if parent is not None else None,
            entry[0] if entry is not None else _spans.current(),
        )
        if key:
            # What runs next in this context (an ocular.span, say) is inside it, until its end.
            self._open[ctx.span_id] = (key, begun, _spans._current.set(key))

    def on_end(self, span: Any) -> None:
        entry = self._open.pop(span.get_span_context().span_id, None)
        if entry is None:
            return
        key, begun, token = entry
        try:
            _spans._current.reset(token)
        except (ValueError, RuntimeError):
            pass  # ended in another context than it began in: that context's enclosing span stays
        attrs = span.attributes
        later: list[tuple[str, int, str]] = []
        if attrs:
            now = attrs.copy()
            if now != begun:
                later = _spans.attributes({k: v for k, v in now.items() if begun is None or k not in begun
                                           or begun[k] != v})
        status = span.status
        code = getattr(status.status_code, "value", 0)
        _ocular.span_end(key, code if code in (0, 1, 2) else 0, status.description or "", later)
        if _spans._rules and span.end_time and span.start_time:
            _spans.ended(span.name, (span.end_time - span.start_time) / 1e9)

    def shutdown(self) -> None:
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
