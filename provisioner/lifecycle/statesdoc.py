"""Renders the transition table to ``docs/states.md`` (Mermaid). A test fails when stale.

Regenerate with ``python -m provisioner.lifecycle.statesdoc > docs/states.md``.
"""

from __future__ import annotations

from provisioner.lifecycle.states import FAILED, IN_FLIGHT, TRANSITIONS, NodeState


def render() -> str:
    lines = [
        "# Node states",
        "",
        "Generated from `provisioner/lifecycle/states.py` by",
        "`python -m provisioner.lifecycle.statesdoc > docs/states.md`; do not edit by hand.",
        "",
        "Stable states wait for a request or a policy; in-flight states run one step and end in",
        "`done` (next state) or `fail`/`abort` (their `*_failed` twin, which `retry` leaves).",
        "Maintenance is a flag, not a state: it holds a node's next sub-step and refuses",
        "`inspect`, `deploy` and `retry` until it is turned off.",
        "",
        "```mermaid",
        "stateDiagram-v2",
    ]
    for state in NodeState:
        if state in IN_FLIGHT:
            lines.append(f"    {state}: {state} (in flight)")
    for (source, event), target in sorted(TRANSITIONS.items()):
        lines.append(f"    {source} --> {target}: {event}")
    lines += ["```", "", "| state | kind | events accepted |", "|---|---|---|"]
    for state in NodeState:
        kind = "in flight" if state in IN_FLIGHT else "failed" if state in FAILED else "stable"
        events = sorted(f"`{event}` → `{target}`" for (source, event), target in
                        TRANSITIONS.items() if source == state)
        lines.append(f"| `{state}` | {kind} | {', '.join(events)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
