"""Which roots may share a kernel without a cycle, for the fusion planner (fusion.py).

Kernels run one after another, so grouping roots must keep the kernels a DAG: a root may not join
a group whose kernel it needs through another kernel or an ATen call (or that needs it that
way), a write at indices (index_put) may share a kernel with nothing that reads its result or
computes the tensor it copies, and a whole grouping is checked for cycles through third kernels.
The attributes (``buffered``, ``views``, ``order``, ``apart``, ``reads``, ``subtree``) are the
planner's.
"""

from __future__ import annotations

from ..ir.node import Node
from ..ir.ops import Op
from .group_spec import BUFFER_OPS, GroupSpec
from .reuse import REACH_LIMIT, reach_sets
from .steps import _symbols, copied_base


class CycleChecks:
    """Dependency walks over the planner's graph; mixed into Planner."""

    def _acyclic(self, groups: list[GroupSpec]) -> bool:
        index = {r: i for i, g in enumerate(groups) for r in g.roots}
        made_by: dict[Node, set[int]] = {}

        def producers(x: Node) -> set[int]:
            """The groups ``x`` needs: its own, or, for what no kernel computes (an ATen call such
            as a matmul, a view), the groups its inputs need."""
            if x in index:
                return {index[x]}
            if x not in made_by:
                made_by[x] = set()  # (a DAG: no node reaches itself)
                made_by[x] = set().union(*(producers(i) for i in x.inputs)) if x.inputs else set()
            return made_by[x]

        needs: list[set[int]] = []
        for i, g in enumerate(groups):
            read = {x for r in g.roots for x in self.reads(r)}
            read |= {self.views.get(b, b) for b in (copied_base(r) for r in g.roots if r.op is Op.INDEX_PUT)}
            if self._size_binders:  # the ATen calls binding the sizes its ops use (a.clamp(min=a.mean().item()))
                read |= self._binders_of(_symbols({n for r in g.roots for n in (r, *self.subtree(r))}))
            need: set[int] = set()
            for x in read:
                if x in index:
                    need.add(index[x])
                elif i in producers(x):
                    return False  # it reads an ATen result computed from its own results
                else:
                    need |= producers(x)
            needs.append(need - {i})
        state = [0] * len(groups)  # 0 new, 1 on the path, 2 done

        def visit(i: int) -> bool:
            if state[i] == 1:
                return False
            if state[i] == 2:
                return True
            state[i] = 1
            ok = all(visit(j) for j in needs[i])
            state[i] = 2
            return ok

        return all(visit(i) for i in range(len(groups)))

    def _closes_cycle(self, root: Node, group: GroupSpec, groups: list[GroupSpec]) -> bool:
        group.roots.append(root)
        try:
            return not self._acyclic(groups)
        finally:
            group.roots.pop()

    def _blocked(self, root: Node, group: GroupSpec, owner: dict[Node, GroupSpec]) -> bool:
        if any(frozenset((root, r)) in self.apart for r in group.roots):
            return True
        if self._put_blocked(root, group.roots):
            return True
        # A cycle appears if root needs, through another kernel or an ATen call, something
        # this group computes, or the group needs root that way.
        # Roots of this kernel are computed in it, so a path through one stays inside.
        members = set(group.roots)
        ungrouped = {n for n in self.buffered if n not in owner} if self._optimistic else set()
        inside = frozenset(members | {root} | ungrouped)
        return self._depends(root, members, direct_ok=True, inside=inside) or any(
            self._depends(r, {root}, direct_ok=True, inside=inside) for r in group.roots)

    def _put_blocked(self, root: Node, members: list[Node]) -> bool:
        """A write at indices is complete only when its kernel ends, and its buffer is filled
        before the kernel starts: nothing in its kernel may read its result, and the tensor it
        copies may not come from its kernel."""
        for put, others in [(r, [root]) for r in members if r.op is Op.INDEX_PUT] + (
                [(root, members)] if root.op is Op.INDEX_PUT else []):
            base = copied_base(put)
            for other in others:
                if (other is base or self._depends(other, {put}, direct_ok=False)
                        or self._depends(base, {other}, direct_ok=False)):
                    return True
        return False

    def _depends(self, node: Node, targets: set[Node], direct_ok: bool, inside: frozenset[Node] = frozenset()) -> bool:
        """Does ``node`` need any of ``targets`` through a buffer boundary? Buffered nodes in
        ``inside`` (computed by the same kernel) are no boundary, except writes at indices.
        The walk skips inputs from which no target can be reached: on large graphs, most."""
        if self._reach is None and len(self.order) <= REACH_LIMIT:
            self._reach = reach_sets(self.graph)
        if self._reach is not None:
            reach, mask = self._reach, 0
            for t in targets:
                mask |= 1 << self.order[t]
            leads = lambda x: reach[x] & mask  # noqa: E731
        else:  # (inputs precede their users: nothing before every target leads to one)
            first = min((self.order[t] for t in targets), default=len(self.order))
            leads = lambda x: self.order[x] >= first  # noqa: E731
        stack = [(x, False) for x in node.inputs if leads(x)]
        seen: set[tuple[Node, bool]] = set()
        while stack:
            n, crossed = stack.pop()
            if (n, crossed) in seen:
                continue
            seen.add((n, crossed))
            boundary = (n in self.buffered and (n not in inside or n.op is Op.INDEX_PUT)) or n.op in BUFFER_OPS
            if n in targets and (crossed or not direct_ok):
                return True
            if n in targets and not crossed:
                continue  # read directly inside the kernel: fine
            stack.extend((x, crossed or boundary) for x in n.inputs if leads(x))
        return False
