"""The engines that rewrite a graph with the rules: :mod:`.egglog` (equality saturation, then extraction) and
:mod:`.fallback` (a pattern matcher on the graph itself, for graphs too large to saturate); and what both use:
:mod:`.budget` (deadlines, the collector paused) and :mod:`.regions` (elementwise chains run as one kernel,
applied to either engine's result)."""
