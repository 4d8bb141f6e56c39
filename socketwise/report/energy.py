"""Energy: watts and output tokens per watt at every measured step, per power source.

Plain Python with no Ansible import, no plotting.
"""

from __future__ import annotations

import statistics

from socketwise.measure import rundir
from socketwise.report.points import Curves, rounded


def energy(axes: dict[str, Curves], rows: list[rundir.PowerRow] | None, host: str) -> dict:
    if rows is None:
        return {"status": "not measured: no power.csv"}
    rows = [r for r in rows if r.host == host]
    if not rows:
        return {"status": f"not measured: power.csv has no row for {host}"}
    sources = sorted({r.source for r in rows}, key=lambda s: (s != "ipmi", s != "rapl", s))
    by_source = {}
    for source in sources:
        mine = [r for r in rows if r.source == source]
        idle_rows = [r.watts for r in mine if r.layout == rundir.IDLE]
        idle = statistics.median(idle_rows) if idle_rows else None
        steps = []
        for axis, curves in axes.items():
            for name, points in curves.items():
                for p in points:
                    watts = [
                        r.watts for r in mine if (r.layout, r.axis, r.load) == (name, axis, p.load)
                    ]
                    if not watts:
                        continue
                    w = statistics.median(watts)
                    above = w - idle if idle is not None else None
                    steps.append(
                        {
                            "layout": name,
                            "axis": axis,
                            axis: p.load,
                            "watts": rounded(w, 2),
                            "output_tok_s": rounded(p.tok),
                            "tok_per_w": rounded(p.tok / w) if w > 0 else None,
                            "tok_per_w_above_idle": rounded(p.tok / above)
                            if above and above > 0
                            else None,
                        }
                    )
        by_source[source] = {"idle_watts": idle, "steps": steps}
    primary = sources[0]
    return {
        "status": "measured",
        "source": primary,
        "idle_watts": by_source[primary]["idle_watts"],
        "steps": by_source[primary]["steps"],
        "sources": by_source,
    }
