"""A plan as text (per rank), JSON (for tools), Graphviz dot (like seed 002's figures), or each\nrank's step program (``plan --format program``)."""
from __future__ import annotations

import json
import re

from singa_mpi.planner.plan import Plan
from singa_mpi.planner.schedule import BACKWARD, FORWARD, PARAMS, predicted_bytes, schedules, step_programs
from singa_mpi.planner.syncs import SHARED_MEMORY
from singa_mpi.program.schedules import placed_slots, timeline

# one colour per rank (ColorBrewer Set3-like, readable on white)
COLOURS = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#d9d9d9",
           "#bc80bd", "#ccebc5", "#ffed6f", "#ffffb3"]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def traffic(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> dict[int, dict[str, int]]:
    """Bytes each rank sends and receives per step, by direction (forward/backward/params)."""
    out = {}
    for rank, ops in schedules(plan, method, algorithm).items():
        row = {f"{d}_{k}": 0 for d in (FORWARD, BACKWARD, PARAMS) for k in ("sent", "received")}
        for op in ops:
            row[f"{op.direction}_sent"] += op.send_bytes
            row[f"{op.direction}_received"] += op.recv_bytes
        out[rank] = row
    return out


_COPY = re.compile(r"(?:^|\()(\d+)#([^@()>-]+)")  # "3#gru@0", "bridge_src(3#gru@0->...)": copy 3 of gru


def _time_copies(plan: Plan) -> dict[str, int]:
    """Per unrolled layer (SINGA's "<t>#<name>" copies): how many copies the plan has."""
    counts: dict[str, int] = {}
    for sub in plan.sublayers:
        m = _COPY.match(sub.origin or "")
        if m:
            counts[m.group(2)] = max(counts.get(m.group(2), 0), int(m.group(1)) + 1)
    return counts


def to_program(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> str:
    """Each rank's step program, one action per line (what the runtime executes, in order)."""
    lines = [f"programs: phase {plan.phase}, {plan.nranks} worker(s), param sync {method}"]
    for rank, prog in step_programs(plan, method, algorithm).items():
        lines.append(f"\nrank {rank}:")
        lines += [f"  {i:>4}  {line}" for i, line in enumerate(prog.lines())]
    return "\n".join(lines)


def to_text(plan: Plan, method: str = SHARED_MEMORY, full: bool = False, algorithm=None) -> str:
    """Per rank, its sub-layers with shapes, shards and exchanges; an unrolled net shows only the first
    time step's copies (marked with their count) unless ``full``."""
    lines = [f"plan: phase {plan.phase}, {plan.nranks} worker(s), batch {plan.batch}, param sync {method}"]
    volume = traffic(plan, method, algorithm)
    copies = {} if full else _time_copies(plan)
    one_micro = plan.pipeline is not None and not full
    for rank in range(plan.nranks):
        lines.append(f"\nrank {rank}:")
        for sub in plan.on_rank(rank):
            if one_micro and sub.micro > 0:
                continue  # a later micro-batch's copy: like micro-batch 0's
            m = _COPY.search(sub.name)
            if copies and m and int(m.group(1)) > 0:
                continue  # a later time step's copy: like copy 0
            if copies and m:
                times = f" (x{copies.get(m.group(2), 1)} time steps)"
            else:
                times = ""
            mark = "  " if sub.origin else "+ "  # "+" marks an inserted connection layer
            detail = ""
            if sub.exchange is not None:
                ex = sub.exchange
                detail = f"  [{ex.forward_op}/{ex.backward_op or '-'} group {list(ex.group)}]"
            lines.append(f"  {mark}{sub.name:<34} {sub.type:<15} out {list(sub.out_shape)}{detail}{times}")
            for shard in sub.params:
                offsets = ", ".join(f"{lo}:{hi}" for lo, hi in shard.offsets)
                lines.append(f"      param {shard.name:<12} {list(shard.shape)} of {list(shard.logical_shape)} "
                             f"at [{offsets}]")
        v = volume[rank]
        lines.append(f"  traffic/step: forward sent {_fmt_bytes(v['forward_sent'])}, received "
                     f"{_fmt_bytes(v['forward_received'])}; backward sent {_fmt_bytes(v['backward_sent'])}, "
                     f"received {_fmt_bytes(v['backward_received'])}; param sync sent "
                     f"{_fmt_bytes(v['params_sent'])}, received {_fmt_bytes(v['params_received'])}")
    if copies:
        lines.append("\n(unrolled: only time step 0's copies are listed, each with its number of time steps; "
                     "plan --full lists every copy)")
    if plan.pipeline is not None:
        if one_micro:
            lines.append(f"\n(pipelined: only micro-batch 0's sub-layers are listed, the traffic is of all "
                         f"{plan.pipeline.micro_batches}; plan --full lists every micro-batch's)")
        lines += [""] + timeline(plan)
    total = {k: sum(v[k] for v in volume.values()) for k in next(iter(volume.values()))}
    inserted = sum(1 for s in plan.sublayers if s.origin is None)
    lines.append(f"\ntotal: {len(plan.sublayers)} sub-layers ({inserted} inserted), "
                 f"{len(plan.exchanges)} exchanges, {len(plan.param_syncs)} replicated param shards; "
                 f"per step sent forward {_fmt_bytes(total['forward_sent'])}, backward "
                 f"{_fmt_bytes(total['backward_sent'])}, param sync {_fmt_bytes(total['params_sent'])} "
                 f"(+ {_fmt_bytes(total['params_received'])} read or received)")
    return "\n".join(lines)


def to_json(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> str:
    subs = [{
        "name": s.name, "type": s.type, "rank": s.rank, "origin": s.origin, "srcs": s.srcs,
        "partition_dim": s.pdim if s.origin else None,
        "rows": list(s.region.rows), "features": list(s.region.features), "out_shape": list(s.out_shape),
        "params": [{"name": p.name, "shape": list(p.shape), "logical_shape": list(p.logical_shape),
                    "offsets": [list(o) for o in p.offsets]} for p in s.params],
        "exchange": s.exchange.id if s.exchange else None,
    } for s in plan.sublayers]
    exchanges = [{
        "id": e.id, "src": e.src_layer, "dst": e.dst_layer, "kind": e.kind, "forward_op": e.forward_op,
        "backward_op": e.backward_op, "group": list(e.group), "dtype": e.dtype,
        "pieces": [{"src": p.src, "dst": p.dst, "rows": list(p.region.rows),
                    "features": list(p.region.features)} for p in e.pieces],
    } for e in plan.exchanges]
    sched = {str(rank): [{"op": o.op, "peer": o.peer, "group": list(o.group), "root": o.root, "tag": o.tag,
                          "shape": list(o.shape), "dtype": o.dtype, "layer": o.layer, "direction": o.direction}
                         for o in ops] for rank, ops in schedules(plan, method, algorithm).items()}
    params = [{"name": p.name, "offsets": [list(o) for o in p.offsets], "ranks": list(p.ranks), "size": p.size}
              for p in plan.param_syncs]
    return json.dumps({"phase": plan.phase, "nranks": plan.nranks, "batch": plan.batch, "sublayers": subs,
                       "exchanges": exchanges, "schedule": sched, "param_syncs": params,
                       "sync_method": method,
                       "traffic": {str(k): v for k, v in traffic(plan, method, algorithm).items()},
                       # bytes per step (sent + received) of each row of the end-of-run communication table
                       "predicted_bytes": {str(k): v for k, v in predicted_bytes(plan, method, algorithm).items()}},
                      indent=1)


def to_dot(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> str:
    """The sub-layers per worker with their edges (dashed: data moving between workers); a pipelined
    plan's micro-batch 0, and its schedule as a table of slots per worker."""
    shown = {s.name for s in plan.sublayers if plan.pipeline is None or s.micro == 0}
    lines = ["digraph plan {", "  rankdir=BT;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for rank in range(plan.nranks):
        lines.append(f'  subgraph cluster_rank{rank} {{ label="worker {rank}"; style=dashed;')
        for sub in (s for s in plan.on_rank(rank) if s.name in shown):
            shape = "box" if sub.origin else "ellipse"
            label = sub.name if sub.origin else f"{sub.name}\\n{sub.type} {sub.exchange.forward_op}"
            lines.append(f'    "{sub.name}" [label="{label}", shape={shape}, '
                         f'fillcolor="{COLOURS[rank % len(COLOURS)]}"];')
        lines.append("  }")
    for sub in plan.sublayers:
        for src in sub.srcs if sub.name in shown else ():
            lines.append(f'  "{src}" -> "{sub.name}";')
    drawn = set()
    for ex in plan.exchanges:  # dashed edges: data moving between ranks
        subs = [s for s in plan.sublayers if s.exchange is ex and s.name in shown]
        for piece in ex.pieces:
            if piece.src == piece.dst:
                continue
            src = next((s for s in subs if s.rank == piece.src and (s.role != "bridge_dst")), None)
            dst = next((s for s in subs if s.rank == piece.dst and (s.role != "bridge_src")), None)
            if src and dst and src is not dst and (src.name, dst.name) not in drawn:
                drawn.add((src.name, dst.name))
                lines.append(f'  "{src.name}" -> "{dst.name}" [style=dashed, color=gray40];')
    if plan.pipeline is not None:
        lines.append(_schedule_table(plan))
    lines.append("}")
    return "\n".join(lines)


def _schedule_table(plan: Plan) -> str:
    """A node drawn as a table: a row per worker, a column per slot of the schedule (:func:`timeline`'s
    picture), each micro-batch in its colour, F its forward, B its backward, blank idle."""
    pipe = plan.pipeline
    placed = placed_slots(plan)
    length = max(t + 1 for row in placed.values() for t, _, _ in row)
    rows = [f'<TR><TD COLSPAN="{length + 1}"><B>{pipe.schedule}: {pipe.micro_batches} micro-batches</B></TD></TR>']
    for rank in sorted(placed):
        cells = ['<TD BGCOLOR="white"> </TD>'] * length
        for t, label, micro in placed[rank]:
            cells[t] = f'<TD BGCOLOR="{COLOURS[micro % len(COLOURS)]}">{label}</TD>'
        rows.append(f"<TR><TD>worker {rank}</TD>{''.join(cells)}</TR>")
    return ('  schedule [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">'
            + "".join(rows) + "</TABLE>>];")


def roles_lines(cfg, the_plan) -> list[str]:
    """For ``plan`` of a job with several worker groups or server ranks: SINGA's framework, which
    rank is which worker or server, and which server holds which slice of which param."""
    from singa_mpi.algorithms import frozen_params
    from singa_mpi.planner.plan import untrained_params
    from singa_mpi.planner.servers import describe, server_ranges, trained_params
    from singa_mpi.topology import ranks_needed, topology

    cluster = type(cfg.proto.cluster)()
    cluster.CopyFrom(cfg.proto.cluster)
    if cluster.nworker_groups <= 1 and not cluster.server_worker_separate:
        return []
    cluster.nworkers_per_group = the_plan.nranks
    topo = topology(ranks_needed(cluster), cluster, where=cfg.where("cluster"))
    lines = [f"cluster: {topo.describe()} (launch with mpiexec -n {topo.world_size})"]
    if topo.servers_separate:
        frozen = frozen_params(cfg.proto) | untrained_params(the_plan.sublayers)
        ranges = server_ranges(trained_params(the_plan, frozen), len(topo.server_groups[0]))
        lines += ["  param slices (SINGA's slicing rule):"] + describe(ranges, topo.server_groups[0])
        lines.append("  each worker sends the servers its gradient pieces of these slices and takes the values "
                     "back: the servers replace the param sync the plan below lists")
    elif topo.framework == "Hogwild":
        shared = "in node-shared memory when on one node" if cluster.share_memory and topo.workers_per_group == 1 \
            else f"exchanged every {cluster.sync_freq} update(s)"
        lines.append(f"  each group updates its own copy of the params, {shared}")
    return lines + [""]
