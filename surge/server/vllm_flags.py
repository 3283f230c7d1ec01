"""vLLM 0.26's ``vllm serve`` flags that Surge has no counterpart for, by why, so that `surge serve`
names them as vLLM's (with what to do) instead of a bare "unrecognized arguments" or a "did you
mean" pointing at a different Surge flag (``--mamba-block-size``: ``--block-size``). The flags
Surge spells otherwise or answers with a flag of its own are
:data:`surge.server.cli.VLLM_SERVE_FLAG_HINTS`; those it takes are its own flags."""

from __future__ import annotations

LORA_FLAGS: frozenset[str] = frozenset(
    {
        "--default-mm-loras",
        "--enable-mixed-moe-lora-format",
        "--enable-moe-shared-loras",
        "--enable-tower-connector-lora",
        "--fully-sharded-loras",
        "--lora-dtype",
        "--lora-target-modules",
        "--max-cpu-loras",
        "--specialize-active-lora",
    }
)
"""vLLM's LoRA settings: Surge serves no LoRA adapters."""

MIXTURE_OF_EXPERTS_AND_MAMBA_FLAGS: frozenset[str] = frozenset(
    {
        "--all2all-backend",
        "--enable-bf16x3-router-gemm",
        "--enable-mamba-cache-stochastic-rounding",
        "--enable-return-routed-experts",
        "--eplb-config",
        "--expert-placement-strategy",
        "--mamba-backend",
        "--mamba-block-size",
        "--mamba-cache-dtype",
        "--mamba-cache-mode",
        "--mamba-cache-philox-rounds",
        "--mamba-ssm-cache-dtype",
        "--moe-backend",
    }
)
"""vLLM's mixture-of-experts and Mamba settings: Surge serves dense transformers only."""

MULTIMODAL_FLAGS: frozenset[str] = frozenset(
    {
        "--allowed-local-media-path",
        "--allowed-media-domains",
        "--disable-chunked-mm-input",
        "--enable-mm-embeds",
        "--interleave-mm-strings",
        "--language-model-only",
        "--media-io-kwargs",
        "--mm-encoder-attn-backend",
        "--mm-encoder-attn-dtype",
        "--mm-encoder-fp8-scale-path",
        "--mm-encoder-fp8-scale-save-margin",
        "--mm-encoder-fp8-scale-save-path",
        "--mm-encoder-only",
        "--mm-encoder-tp-mode",
        "--mm-ipc-gpu-memory-gb",
        "--mm-processor-cache-gb",
        "--mm-processor-cache-type",
        "--mm-shm-cache-max-object-size-mb",
        "--mm-tensor-ipc",
        "--skip-mm-profiling",
        "--video-pruning-rate",
    }
)
"""vLLM's multimodal settings: Surge serves text-only models."""

OTHER_FLAGS: frozenset[str] = frozenset(
    {
        "--additional-config",
        "--aggregate-engine-logging",
        "--allow-deprecated-quantization",
        "--calculate-kv-scales",
        "--collect-detailed-traces",
        "--config-format",
        "--cp-kv-cache-interleave-size",
        "--cpu-distributed-timeout-seconds",
        "--cpu-offload-params",
        "--cudagraph-metrics",
        "--data-parallel-supervisor-port",
        "--dbo-decode-token-threshold",
        "--dbo-prefill-token-threshold",
        "--dcp-comm-backend",
        "--dcp-kv-cache-interleave-size",
        "--device-ids",
        "--diffusion-config",
        "--disable-hybrid-kv-cache-manager",
        "--disable-nccl-for-dp-synchronization",
        "--distributed-timeout-seconds",
        "--dp-supervisor-probe-failure-threshold",
        "--dp-supervisor-probe-interval-s",
        "--dp-supervisor-probe-timeout-s",
        "--ec-transfer-config",
        "--enable-cumem-allocator",
        "--enable-dbo",
        "--enable-elastic-ep",
        "--enable-ep-weight-filter",
        "--enable-flash-late-interaction",
        "--enable-flashinfer-autotune",
        "--enable-layerwise-nvtx-tracing",
        "--enable-log-deltas",
        "--enable-logging-iteration-details",
        "--enable-mfu-metrics",
        "--enable-offline-docs",
        "--enable-per-request-metrics",
        "--enable-prompt-embeds",
        "--fail-on-environ-validation",
        "--fingerprint-mode",
        "--fingerprint-value",
        "--gdn-prefill-backend",
        "--grpc",
        "--hf-config-path",
        "--ignore-patterns",
        "--io-processor-plugin",
        "--ir-op-priority",
        "--jit-monitor-mode",
        "--jit-monitor-verbose",
        "--kernel-config",
        "--kv-cache-dtype-skip-layers",
        "--kv-cache-metrics",
        "--kv-cache-metrics-sample",
        "--kv-events-config",
        "--kv-offloading-backend",
        "--kv-offloading-size",
        "--kv-sharing-fast-prefill",
        "--linear-backend",
        "--log-error-stack",
        "--max-parallel-loading-workers",
        "--model-class-overrides",
        "--model-loader-extra-config",
        "--numa-bind",
        "--numa-bind-cpus",
        "--numa-bind-nodes",
        "--offload-backend",
        "--offload-group-size",
        "--offload-num-in-group",
        "--offload-params",
        "--offload-prefetch-step",
        "--override-attention-dtype",
        "--performance-mode",
        "--pooler-config",
        "--prefill-schedule-interval",
        "--prefix-match-unit",
        "--profiler-config",
        "--pt-load-map-location",
        "--ray-workers-use-nsight",
        "--reasoning-config",
        "--renderer-num-workers",
        "--safetensors-load-strategy",
        "--safetensors-prefetch-block-size",
        "--safetensors-prefetch-num-threads",
        "--scheduler-cls",
        "--scheduler-reserve-full-isl",
        "--show-hidden-metrics-for-version",
        "--tokens-only",
        "--tool-server",
        "--ubatch-size",
        "--use-fp64-gumbel",
        "--use-tqdm-on-load",
        "--watermark",
        "--weight-transfer-config",
        "--worker-cls",
        "--worker-extension-cls",
    }
)
"""The rest of vLLM 0.26's ``vllm serve`` flags that Surge lacks: settings of machinery it does
not have (offloading, KV connectors, plugins, extra metrics, NUMA binding, ...)."""


NO_LORA = "nothing: Surge serves no LoRA adapters (merge the adapter into the model's weights)"
DENSE_ONLY = "nothing: Surge serves dense models (Qwen3, Qwen2, Llama 3.x) only"
TEXT_ONLY = "nothing: Surge serves text-only models"
NO_COUNTERPART = "nothing: Surge has no such setting (`surge serve --help` lists its flags)"


def vllm_flags_without_counterpart() -> dict[str, str]:
    """Each flag of this module -> what to use instead, as ``flag_hints`` of the serve parser
    (its error line reads "vLLM's FLAG: use HINT")."""
    return {
        **{flag: NO_COUNTERPART for flag in OTHER_FLAGS},
        **{flag: TEXT_ONLY for flag in MULTIMODAL_FLAGS},
        **{flag: DENSE_ONLY for flag in MIXTURE_OF_EXPERTS_AND_MAMBA_FLAGS},
        **{flag: NO_LORA for flag in LORA_FLAGS},
    }
