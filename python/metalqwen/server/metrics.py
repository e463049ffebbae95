"""/metrics in the Prometheus text format, with the counters vLLM and llama-server expose."""

from __future__ import annotations


class Metrics:
    def __init__(self, model, worker):
        self.model, self.worker = model, worker
        self.requests = 0
        self.prompt_tokens = self.generated_tokens = self.cached_tokens = self.cache_hits = 0

    def finished(self, job) -> None:
        s = job.stats
        if s is None:
            return
        self.prompt_tokens += s.prompt_tokens
        self.generated_tokens += s.generated_tokens
        self.cached_tokens += s.prompt_tokens_reused
        self.cache_hits += s.prompt_tokens_reused > 0

    def render(self) -> str:
        counters = self.model.counters()
        rows = [
            ("requests_total", "counter", "requests accepted", self.requests),
            ("prompt_tokens_total", "counter", "prompt tokens of finished requests", self.prompt_tokens),
            ("generated_tokens_total", "counter", "tokens generated", self.generated_tokens),
            ("cache_hits_total", "counter", "requests that reused cached tokens", self.cache_hits),
            ("cached_tokens_total", "counter", "prompt tokens taken from the cache", self.cached_tokens),
            ("queue_depth", "gauge", "requests waiting for the engine", self.worker.queue_depth),
            ("engine_steps_total", "counter", "steps the engine committed", counters["steps"]),
            ("engine_command_buffers_total", "counter", "command buffers of those steps", counters["command_buffers"]),
            ("engine_pipelined_steps_total", "counter", "shared steps committed while another was running",
             counters["pipelined_steps"]),
            ("engine_failed_steps_total", "counter", "steps the GPU failed (their requests got the error)",
             counters["failed_steps"]),
            ("verify_steps_total", "counter", "speculative verify steps", counters["verify_steps"]),
            ("drafted_tokens_total", "counter", "draft tokens verified", counters["drafted"]),
            ("accepted_tokens_total", "counter", "draft tokens accepted", counters["accepted"]),
        ]
        if self.model.vision is not None:
            rows += [("vision_tower_runs_total", "counter", "images the vision tower ran over",
                      counters["vision_tower_runs"]),
                     ("vision_features_reused_total", "counter", "images whose features came from the tower's cache",
                      counters["vision_features_reused"])]
        cache = self.model.prefix_cache
        if cache is not None:
            rows += [("prefix_cache_bytes", "gauge", "device memory the prefix cache holds", cache.bytes),
                     ("prefix_cache_entries", "gauge", "snapshots the prefix cache holds", len(cache)),
                     ("prefix_cache_evictions_total", "counter", "snapshots evicted (LRU)", cache.evictions)]
            disk = cache.disk
            if disk is not None:
                rows += [("disk_cache_hits_total", "counter", "prompts resumed from a --cache-dir file", disk.hits),
                         ("disk_cache_writes_total", "counter", "snapshot files written", disk.writes),
                         ("disk_cache_written_bytes_total", "counter", "bytes of the files written",
                          disk.bytes_written),
                         ("disk_cache_bytes", "gauge", "bytes of the folder's snapshot files (as last counted)",
                          disk.bytes),
                         ("disk_cache_evictions_total", "counter", "files removed over the byte budget",
                          disk.evictions),
                         ("disk_cache_rejected_total", "counter", "files removed as corrupt or foreign",
                          disk.rejected),
                         ("disk_cache_skipped_total", "counter", "writes dropped while the writer was behind",
                          disk.skipped)]
        return "".join(f"# HELP metalqwen_{n} {h}\n# TYPE metalqwen_{n} {t}\nmetalqwen_{n} {v}\n"
                       for n, t, h, v in rows)
