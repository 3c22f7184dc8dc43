"""Passes over fusionc IR, one per file, and the pipeline driver.

- ``partition-cluster{size=C}`` (:mod:`.partition_cluster`): graph IR of attention and MLP blocks
  to tile-IR cluster kernels (ClusterFusion decomposition), C chosen by the cost model when 0.
- ``fuse`` (:mod:`.fuse`): merges independent consecutive launches into one kernel.
- design v2 (``lowering = v2``, :mod:`.stream`): ``partition-units`` (the unit schedule),
  ``stream-plan`` (tiles through a TMA-fed ring), ``insert-barriers`` (the ring's waits and
  proxy fences), ``smem-plan`` (ring depth from the shared-memory budget); before them
  ``fold-views`` (:mod:`.fold_views`: views moved past elementwise ops and cancelled);
  ``attention-units`` (:mod:`.attention_units`: attention cores as units kernels, alone before
  ``lower-library`` on the mixed path).
"""
from fusionc.passes import fold_views, fuse, fuse_allreduce_norm, lower_library  # noqa: F401
from fusionc.passes import partition_cluster, split_tokens, stream  # noqa: F401
from fusionc.passes.base import PASSES, Pass, register_pass
from fusionc.passes.pipeline import DEFAULT_PIPELINE, parse_pipeline, run_pipeline

__all__ = ["PASSES", "Pass", "register_pass", "DEFAULT_PIPELINE", "parse_pipeline",
           "run_pipeline"]
