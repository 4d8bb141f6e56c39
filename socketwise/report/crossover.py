"""Crossover: where one layout overtakes another for good, on one load axis.

Plain Python with no Ansible import, no plotting. Methods
(docs/guides/sweeps-and-reports.md), on the median of the repetitions of each point:

- A layout is *ahead* of another at a load point when its median output tok/s is higher
  by more than TOLERANCE of the larger one and, when both points were repeated, also
  above the other's maximum.
- Crossover of a challenger over the incumbent (SN first): the lowest measured load from
  which the challenger is ahead at every higher measured load, shared by both, with at
  least CONFIRM_POINTS such loads. A lead that does not last to the top of the measured
  range (one spike) does not count; a lead at the top point alone is unconfirmed. The
  value is interpolated linearly, within the bracketing points, where the challenger's
  lead less the tolerance crosses zero.
"""

from __future__ import annotations

from socketwise.report.points import UNITS, Curves, Point, fmt_load, fmt_loads, fmt_num

TOLERANCE = 0.03
CONFIRM_POINTS = 2
# The incumbent every challenger is judged against first: the single-node default.
BASE_LAYOUT = "sn"
CROSSOVER_METHOD = (
    f"lowest measured load from which the challenger's median output tok/s is ahead of the "
    f"incumbent's (by more than {TOLERANCE:.0%} of the larger, and above its maximum when "
    f"both are repeated) at every higher load measured by both, on at least "
    f"{CONFIRM_POINTS} loads; one tied point (neither ahead) between two leads does not "
    f"break it; interpolated between the bracketing loads"
)


def ahead_of(a: Point, b: Point) -> bool:
    """Whether A is ahead of B at one load (the rule in the module docstring)."""
    if a.tok - b.tok <= TOLERANCE * max(a.tok, b.tok):
        return False
    if a.repetitions > 1 and b.repetitions > 1:
        return a.tok > b.stats["output_tok_s"]["max"]
    return True


def _margin(a: Point, b: Point) -> float:
    return a.tok - b.tok - TOLERANCE * max(a.tok, b.tok)


def overtake(incumbent: list[Point], challenger: list[Point], axis: str, names: tuple[str, str]):
    """Where `challenger` overtakes `incumbent` for good (see the module docstring)."""
    inc_name, ch_name = names
    unit = UNITS[axis]
    inc = {p.load: p for p in incumbent}
    ch = {p.load: p for p in challenger}
    common = sorted(set(inc) & set(ch))
    result = {"status": "", axis: None, "between": None, "evidence": "", "ahead_at": []}
    if not common:
        result["status"] = "no-common-points"
        result["evidence"] = f"{ch_name} and {inc_name} share no measured {axis}"
        return result
    ahead = [ahead_of(ch[x], inc[x]) for x in common]
    result["ahead_at"] = [x for x, is_ahead in zip(common, ahead, strict=True) if is_ahead]
    # One tied point with a lead on both sides is noise, not the end of the lead.
    bridged = [
        0 < i < len(common) - 1
        and ahead[i - 1]
        and ahead[i + 1]
        and not ahead[i]
        and not ahead_of(inc[common[i]], ch[common[i]])
        for i in range(len(common))
    ]
    first = len(common)
    while first > 0 and (ahead[first - 1] or bridged[first - 1]):
        first -= 1
    sustained = common[first:]  # the lead that lasts to the top, bridged ties included
    lead = [x for x in sustained if x in result["ahead_at"]]
    spikes = [x for x in result["ahead_at"] if x not in sustained]
    ties = [x for x in sustained if x not in lead]
    spike_note = (
        f"; its lead at {fmt_loads(spikes)} {unit} is not sustained at higher load, so it does "
        f"not count"
        if spikes
        else ""
    )
    if ties:
        spike_note += f"; level at {fmt_loads(ties)} {unit} between leads, which does not end them"
    pairs = "; ".join(
        f"{fmt_load(x)}: {fmt_num(ch[x].tok)} vs {fmt_num(inc[x].tok)}" for x in common
    )
    tok = f" (median output tok/s {ch_name} vs {inc_name} at {axis} {pairs})"
    if not result["ahead_at"]:
        result["status"] = "never"
        result["evidence"] = f"{ch_name} is ahead of {inc_name} at no measured {axis}{tok}"
    elif not lead:
        result["status"] = "never"
        result["evidence"] = (
            f"{ch_name} is not ahead of {inc_name} at the highest measured {axis} "
            f"{fmt_load(common[-1])}{spike_note}{tok}"
        )
    elif len(lead) < CONFIRM_POINTS:
        result["status"] = "unconfirmed"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} only at the highest measured {axis} "
            f"{fmt_load(lead[0])}: one point is not enough, measure beyond it{spike_note}{tok}"
        )
    elif first == 0:
        result["status"] = "ahead-everywhere"
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} by more than {TOLERANCE:.0%} at every measured "
            f"{axis} ({fmt_loads(common)} {unit}), so any crossover lies below "
            f"{fmt_load(common[0])}{spike_note}{tok}"
        )
    else:
        low, high = common[first - 1], common[first]
        m_low, m_high = _margin(ch[low], inc[low]), _margin(ch[high], inc[high])
        share = -m_low / (m_high - m_low) if m_high > m_low else 0.0
        result["status"] = "found"
        result[axis] = round(low + min(1.0, max(0.0, share)) * (high - low), 2)
        result["between"] = [low, high]
        result["evidence"] = (
            f"{ch_name} is ahead of {inc_name} by more than {TOLERANCE:.0%} at every measured "
            f"{axis} from {fmt_load(high)} to {fmt_load(common[-1])} {unit}, "
            f"not at {fmt_load(low)}"
            f"{spike_note}{tok}"
        )
    return result


def crossover_pair(curves: Curves, crossovers: dict) -> tuple[str, str] | None:
    """(sn, the DP layout) whose crossover is the headline: `dp`, else the first dp-*."""
    dps = [n for n in crossovers if n == "dp"] or [n for n in crossovers if n.startswith("dp")]
    return (BASE_LAYOUT, dps[0]) if dps and BASE_LAYOUT in curves else None
