"""``sts`` and ``datasync`` on the route seam (bridge/routes): one remote job for all of a
plan's files, committed by the engine from what the stores report.

``serves`` says, without a request, whether the pair and the settings allow the route; it is
taken by itself only when enabled (``native.enabled``), and ``--route`` forces it. A job the
service refuses before any byte moved (permission, quota, a bad location), and one the route
cannot express (a renamed object, more files than one job can name, a name its filter cannot
hold), falls back to ``direct``
as a whole, with the reason recorded; a remote run that fails after moving data fails the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bridge.routes import delegated as native
from bridge.config import Settings
from bridge.errors import BridgeError, IntegrityError, JobCancelled, ObjectNotFound, RouteUnavailable
from bridge.routes import Fallback, Route, register
from bridge.stores.base import identity_changed
from bridge.urls import Location, parse

if TYPE_CHECKING:
    from bridge.contracts import FilePlan, RouteContext, RoutedPlan
    from bridge.manifest import FileEntry


class NativeRoute(Route):
    """A cloud transfer service running one job for the files of a plan."""

    remote = True            # the bytes move in the cloud: cancel the remote job with the bridge job
    module: Any = None

    def serves(self, src: Location, dst: Location, settings: Settings) -> str | None:
        try:
            self.module.check(src, dst, settings)
        except RouteUnavailable as exc:
            return str(exc)
        return None

    def enabled(self, settings: Settings) -> bool:
        return self.name in settings.native.enabled

    def units(self, plan: RoutedPlan) -> Iterator[dict[str, Any]]:
        for rel in plan.deletions:
            yield {"op": "delete", "rel": rel}
        if plan.files:
            yield {"op": "route", "files": [f.rel for f in plan.files]}

    def unit_count(self, plan: RoutedPlan) -> int:
        return len(plan.deletions) + (1 if plan.files else 0) + 1

    def transfer(self, ctx: RouteContext, files: list[FilePlan]) -> native.Transfer:
        """The remote job's files, each checked to be the version planned; named one by one
        unless they are every object under the source root."""
        if ctx.plan.single is not None and files[0].rel != parse(ctx.plan.single).name:
            raise RouteUnavailable(f"route {self.name} keeps object names: it cannot write "
                                   f"{ctx.plan.single} as {ctx.dst_loc(files[0].rel)}")
        if ctx.plan.single is not None:   # one object: no need to list its folder
            listed = {files[0].rel: ctx.src.info(ctx.src_loc(files[0].rel))}
        else:
            listed = dict(ctx.src.walk(ctx.src_root))
        objects = []
        for f in files:
            info = listed.get(f.rel)
            if info is None or info.size != f.size or identity_changed(f.source_id, info.identity):
                raise IntegrityError(f"{ctx.src_loc(f.rel)}: changed since the copy was planned; run it again")
            objects.append((f.rel, info))
        named = ctx.plan.single is not None or set(listed) != {f.rel for f in files}
        why = self.module.unnamable([f.rel for f in files], listed) if named else None
        if why:
            raise RouteUnavailable(why)
        return native.Transfer(self.name, ctx.src_root, ctx.dst_root, objects, ctx.plan.single, filtered=named)

    def run(self, ctx: RouteContext, files: list[FilePlan]) -> Iterator[tuple[str, FileEntry | Fallback]]:
        if not files:
            return
        try:
            transfer = self.transfer(ctx, files)
            remote = self.module.run(transfer, ctx.settings, progress=ctx.progress, stop=ctx.cancelled,
                                     count_files=False)
        except JobCancelled as exc:
            ctx.cancel_note = str(exc)
            raise
        except (RouteUnavailable, BridgeError) as exc:
            # Only a refusal before any byte moved (RouteFailed or PermissionDenied with
            # moved_data False, or a job the route cannot express) sends the files direct.
            if not isinstance(exc, RouteUnavailable) and getattr(exc, "moved_data", True):
                raise
            for f in files:
                yield f.rel, Fallback(str(exc), job_wide=True)
            return
        ctx.remote = remote
        look = self.written(ctx.settings)
        for rel, info in transfer.objects:
            try:
                written = look(ctx.dst, ctx.dst_loc(rel))
            except ObjectNotFound:
                raise IntegrityError(f"{ctx.dst_loc(rel)}: {self.name} reported success but the object is "
                                     f"not there") from None
            yield rel, native.reported_entry(transfer, rel, ctx.src, info, written)

    def written(self, settings: Settings):
        return lambda store, loc: store.info(loc)


class StsRoute(NativeRoute):
    name = "sts"

    @property
    def module(self):
        from bridge.routes import sts
        return sts


class DataSyncRoute(NativeRoute):
    name = "datasync"

    @property
    def module(self):
        from bridge.routes import datasync
        return datasync

    def written(self, settings: Settings):
        from bridge.routes import datasync
        return datasync._with_crc32c(settings)


register(StsRoute())
register(DataSyncRoute())
