"""The offline API: ``LLM(...).generate(prompts, sampling_params)``, like vLLM's."""

from __future__ import annotations

import copy
import dataclasses
import logging
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from surge.chat_content_format import check_content_format, describe_content_format
from surge.config import TOKENIZER_FILES
from surge.core.logprobs import PositionLogprobs, position_logprobs
from surge.core.outputs import CompletionOutput, RequestOutput
from surge.core.reasoning_gate import wait_for_reasoning_end
from surge.engine.llm_engine import LLMEngine, build_engine_config, split_n
from surge.generation_defaults import describe_sampling_defaults
from surge.parallel_encode import encode_text, split_safe
from surge.sampling_params import SamplingParams, reported_stop_ids, stop_reason_of, truncated_prompt
from surge.token_strings import TokenStrings
from surge.tokenizer import (
    IncrementalDetokenizer,
    InvalidModelConfigError,
    apply_chat_template,
    bad_words_token_ids,
    described_chat_template,
    has_tokenizer_files,
    load_tokenizer,
)

if TYPE_CHECKING:
    import torch

    from surge.metrics_reader import Metric

PromptType = str | list[int]
logger = logging.getLogger("surge.llm")


@dataclass(slots=True)
class _Child:
    """One engine request of a :meth:`LLM.generate` call: choice ``index`` of prompt ``parent``.
    ``detokenizer`` and ``decode`` (token id -> text, for logprobs) are None under
    ``SamplingParams(detokenize=False)``."""

    parent: int
    index: int
    detokenizer: IncrementalDetokenizer | None
    decode: Callable[[int], str] | None
    token_ids: list[int]
    stop_ids: frozenset[int] = frozenset()
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[PositionLogprobs] | None = None


class LLM:
    """Offline batched generation on one engine, in this process (no server, no ZMQ).

    Args:
        model: a Hugging Face model folder; None = the bundled stories260K model. A folder
            without tokenizer files takes token-id prompts only, if transformers can build an
            empty tokenizer for the model (else the missing files are the error).
        tokenizer: vLLM's: None or the model folder itself (a script's ``LLM(path,
            tokenizer=path)``); Surge reads the model folder's tokenizer, so another folder is
            refused.
        dtype: "auto" (the config's; a float32 one is bfloat16 on a GPU, as in vLLM:
            :func:`surge.config.auto_dtype`), "float32", "bfloat16" or "float16" (vLLM's "half"
            and "float" are "float16" and "float32"), or one of those as a ``torch.dtype``
            (``torch.bfloat16``), as vLLM takes it.
        device: "auto" (CUDA when available), "cpu" or "cuda".
        load_format: "auto" (safetensors) or "dummy" (random weights, reproducible by seed).
        seed: seed of dummy weights and of unseeded sampling (None: a random one, as vLLM).
        block_size: tokens per KV block (None: 16, as vLLM's None on CUDA).
        num_kv_blocks: KV pool size in blocks; None sizes it from memory.
        max_num_seqs: most sequences in one step (None: 256, or ``max_num_batched_tokens`` when
            that is lower, as vLLM's None derives it).
        max_num_batched_tokens: token budget of one step (None: 8192, where vLLM's None lets its
            engine choose); at least ``max_num_seqs``, or a ValueError naming both (vLLM's check).
        max_model_len: longest prompt + output; None = the model's maximum.
        enable_prefix_caching: share the KV blocks of equal prompt prefixes (None: True, as vLLM's
            None).
        enforce_eager: no CUDA graphs.
        async_scheduling: overlap the host's scheduling with the GPU (None: on for CUDA).
        tensor_parallel_size: shard the model over this many worker processes (GPUs); they
            stop with :meth:`close` or at interpreter exit. They are spawned, so a script
            that uses more than one guards its entry point with ``if __name__ == "__main__":``.
        tp_all_reduce: "nccl" (the default) or "auto" (a peer-memory one-shot all-reduce for
            decode-sized tensors where the GPUs allow it, NCCL for the rest; on two H200s it
            made a batch-1 decode step 3 % slower, benchmarks/results/h200x2/README.md).
        quantization: "fp8" for FP8 weights (a bf16 checkpoint quantized at load; an FP8
            checkpoint is FP8 without it), or None.
        kv_cache_dtype: "auto" (the model dtype) or "fp8".
        fp8_emulation: tests only: run FP8 on CPU by emulation (quantize, then compute on the
            dequantized values); FP8 on CPU is refused without it.
        generation_config: "auto": the model's generation_config.json sampling defaults
            (temperature, top_p, top_k, min_p, repetition_penalty) apply to the fields a
            ``SamplingParams`` leaves out; "none" (or vLLM's "vllm"): they do not; a folder
            holding a generation_config.json (vLLM's third form): that file's, and the EOS ids it
            adds, instead of the model's. The file's ``max_new_tokens`` is
            :meth:`get_default_sampling_params`'s ``max_tokens``.
        override_generation_config: vLLM's: a dict of those fields and ``max_new_tokens``
            merged over the file's values (alone under "none"; a None value drops the file's),
            checked like a request's (ValueError naming the key).
        grammar_compile_timeout: seconds one structured-output grammar may take to compile
            (> 0); a request whose grammar takes longer fails. Grammars compile in worker
            processes (fresh interpreters started on the first grammar; a script needs no
            ``if __name__ == "__main__":`` guard for them).
        hf_overrides: top-level ``config.json`` keys to replace, as vLLM's ``hf_overrides``
            (e.g. a YaRN ``rope_scaling`` for a longer context; see README.md): a dict (vLLM's
            callable on the transformers config is refused: pass the keys it sets).
        scheduling_policy: "fcfs" (arrival order; the default) or "priority" (by each
            request's ``priority``, lower first, then arrival: :meth:`generate`'s ``priority``),
            as vLLM's.
        chat_template: vLLM's: a Jinja chat template file, or the template text (a value with
            a ``{``), or None; :meth:`chat` applies it when its own ``chat_template`` is None
            (vLLM 0.26 loads it into ``llm.chat_template`` but its ``chat`` does not use it).
            Read and parsed here, as the server's ``--chat-template``.
        reasoning_parser: vLLM's: "qwen3" or "deepseek_r1" (the model's ``<think>`` /
            ``</think>``, which must be tokens of its tokenizer, else ``ValueError``), which a ``SamplingParams``'s
            ``thinking_token_budget`` needs (the reasoning end is forced once that many tokens
            were generated inside the reasoning); None: a budget is refused (``ValueError``).
            A grammar (``structured_outputs``) then waits for the output's first ``</think>``
            unless the prompt closed the reasoning, as vLLM's: the model thinks freely, then
            answers in the constrained format. The outputs' text is not split: ``<think>`` ...
            ``</think>`` stays in it, as vLLM's.
        disable_log_stats: vLLM's (a bool; default True, as vLLM's ``LLM``): the offline
            ``LLM`` logs no periodic stats either way, and :meth:`get_metrics` counts either way
            (vLLM's needs False).

    vLLM's ``runner``, ``convert``, ``pipeline_parallel_size``, ``data_parallel_size``,
    ``revision``, ``tokenizer_revision``, ``compilation_config``, ``enable_lora``,
    ``speculative_config``, ``cpu_offload_gb``, ``disable_custom_all_reduce``,
    ``trust_remote_code``, ``tokenizer_mode``, ``skip_tokenizer_init``, ``enable_chunked_prefill``,
    ``max_logprobs``, ``logits_processors`` and a few more are taken at the values that ask for
    nothing Surge lacks (``runner="generate"``, ``pipeline_parallel_size=1``, ``revision=None``,
    ``enable_lora=False``, ``trust_remote_code=False``, ...: :data:`_VLLM_DEFAULT_ONLY`); another
    value is a ``ValueError`` that says what to use. Other vLLM arguments Surge does without
    (``swap_space``, ``task``, ``served_model_name``, ...) are a ``TypeError`` that says so.

    Raises:
        ValueError: a bad model folder or argument, with a message naming it.
        TypeError: an argument that is not Surge's (a vLLM one with what to use instead).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        tokenizer: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str = "auto",
        load_format: str = "auto",
        seed: int | None = 0,
        block_size: int | None = 16,
        num_kv_blocks: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = 8192,
        max_model_len: int | None = None,
        enable_prefix_caching: bool | None = True,
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.9,
        async_scheduling: bool | None = None,
        tensor_parallel_size: int = 1,
        tp_all_reduce: str = "nccl",
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        fp8_emulation: bool = False,
        generation_config: str = "auto",
        grammar_compile_timeout: float = 60.0,
        hf_overrides: dict[str, Any] | None = None,
        scheduling_policy: str = "fcfs",
        override_generation_config: dict[str, Any] | None = None,
        chat_template: str | Path | None = None,
        reasoning_parser: str | None = None,
        disable_log_stats: bool = True,
        **unexpected: Any,
    ) -> None:
        for name in [n for n in unexpected if n in _VLLM_DEFAULT_ONLY]:
            _check_vllm_default(name, unexpected.pop(name))
            if name == "disable_custom_all_reduce" and tp_all_reduce == "auto":
                raise ValueError(
                    "LLM() got disable_custom_all_reduce=True and tp_all_reduce='auto', which "
                    "contradict each other: 'auto' adds Surge's own one-shot all-reduce; leave "
                    "tp_all_reduce out (NCCL only) or drop disable_custom_all_reduce"
                )
        if unexpected:
            raise TypeError(_unexpected_argument(next(iter(unexpected))))
        if not isinstance(disable_log_stats, bool):
            raise ValueError(f"disable_log_stats must be true or false, got {disable_log_stats!r}")
        if reasoning_parser is not None:  # before the model loads
            from surge.server.parsers import check_reasoning_parser

            check_reasoning_parser(reasoning_parser)
        self.chat_template = _load_chat_template(chat_template)
        if model is not None:  # the command line's checks and messages (a hub id: download it first)
            from surge.cli import check_model_dir

            # no tokenizer files needed: an empty tokenizer still takes token-id prompts
            check_model_dir(str(model), load_format, flag="model", offline_api=True)
        config = build_engine_config(
            None if model is None else str(model),
            dtype=dtype,
            load_format=load_format,
            seed=seed,
            device=device,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            async_scheduling=async_scheduling,
            tensor_parallel_size=tensor_parallel_size,
            tp_all_reduce=tp_all_reduce,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            fp8_emulation=fp8_emulation,
            generation_config=generation_config,
            grammar_compile_timeout=grammar_compile_timeout,
            hf_overrides=hf_overrides,
            scheduling_policy=scheduling_policy,
            override_generation_config=override_generation_config,
        )
        _check_tokenizer_folder(tokenizer, config.model.model)
        logger.info(
            describe_sampling_defaults(
                config.model.sampling_defaults,
                config.model.generation_config,
                overridden=bool(config.model.override_generation_config),
            )
        )
        # without tokenizer files transformers builds an empty tokenizer for some models (prompts
        # must then be token ids) and fails for others (then the folder's lack is the error)
        self._text_prompts = has_tokenizer_files(config.model.model)
        try:
            self.tokenizer = load_tokenizer(config.model.model)
        except InvalidModelConfigError:
            raise
        except ValueError:
            if self._text_prompts:
                raise
            from surge.cli import no_tokenizer_message

            raise ValueError(no_tokenizer_message("model", str(model))) from None
        self.token_strings = TokenStrings(self.tokenizer)
        # stop_reason null for this EOS, as vLLM (surge.sampling_params.reported_stop_ids); an
        # empty tokenizer's eos_token_id (a folder without tokenizer files) names no real token
        self._primary_eos: int | None = self.tokenizer.eos_token_id if self._text_prompts else None
        self._splittable = split_safe(self.tokenizer)  # long prompts encoded in pieces
        # (content format, template) pairs whose chat content format was logged (_log_content_format)
        self._content_formats_logged: set[tuple[str, str | None]] = set()
        if reasoning_parser is not None:
            from surge.server.parsers import reasoning_tokens

            config = dataclasses.replace(
                config,
                reasoning_tokens=reasoning_tokens(self.tokenizer, reasoning_parser, flag="reasoning_parser"),
            )
        self.engine = LLMEngine(config)
        self._next_id = 0
        self._closed = False
        # requests of enqueue() calls that wait_for_completion() has not run yet (children's
        # ``parent`` indexes _queued_results)
        self._queued_results: list[RequestOutput] = []
        self._queued_children: dict[str, _Child] = {}
        # get_metrics()'s counts: finished engine requests (each of n choices is one)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished: dict[str, int] = dict.fromkeys(("stop", "length", "abort", "repetition"), 0)

    def close(self) -> None:
        """Stop the engine's worker processes (tensor parallelism). Idempotent; a closed ``LLM``
        refuses :meth:`generate` and :meth:`chat` (``RuntimeError``), with or without workers."""
        self._closed = True
        self.engine.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LLM is closed (close() or the end of its with block); make a new one")

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        """The model's sampling defaults in force (field -> value; empty with "none")."""
        return dict(self.engine.config.model.sampling_defaults)

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """vLLM's: forget every cached prompt prefix (between calls no request holds a block, so
        the next :meth:`generate` computes its prompts from scratch, as a benchmark's fresh
        point needs). Returns True (vLLM's success flag; Surge's reset cannot fail).

        Args:
            reset_running_requests: vLLM's (preempt running requests to free their blocks too):
                taken either way, as no request runs between calls of the offline ``LLM``.
            reset_connector: vLLM's (reset a KV connector's cache too): taken either way, as
                Surge has no KV connector.

        Raises:
            TypeError: an argument that is not a bool.
            RuntimeError: the ``LLM`` is closed (:meth:`close`).
        """
        for name, value in (
            ("reset_running_requests", reset_running_requests),
            ("reset_connector", reset_connector),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"reset_prefix_cache()'s {name} must be a bool, got {value!r}")
        self._check_open()
        self.engine.reset_prefix_cache()
        return True

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: a :class:`SamplingParams` holding the model's sampling defaults in force
        (:attr:`sampling_defaults`: its ``generation_config.json`` values with
        ``generation_config="auto"``, ``max_new_tokens`` as ``max_tokens``, and
        ``override_generation_config``'s over them), its other fields at their defaults
        (``max_tokens`` 16).
        Assign to it as in vLLM's examples (``sp.max_tokens = 256``: checked as on construction)."""
        return SamplingParams(**self.sampling_defaults)  # type: ignore[arg-type]

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = False,
        priority: Sequence[int] | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
        lora_request: object = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt, batched continuously.

        Args:
            prompts: a string, a list of token ids, vLLM's ``{"prompt": ...}`` or
                ``{"prompt_token_ids": [...]}`` dict (with an optional ``cache_salt`` string: only
                prompts of the same salt share prefix-cache blocks), or a list of any of these.
            sampling_params: one for all prompts, one per prompt, or None
                (:meth:`get_default_sampling_params`).
            use_tqdm: a progress bar (stderr) over the finished sequences (vLLM's; off here), or
                as in vLLM a callable that makes it, called with ``total=`` the number of
                sequences (e.g. ``functools.partial(tqdm, desc="mine")``).
            priority: one integer per prompt (its choices share it), as vLLM's: with
                ``LLM(scheduling_policy="priority")`` lower values are scheduled first (ties by
                the order of the prompts) and preempted last; under "fcfs" every value must be 0.
            tokenization_kwargs: vLLM's overrides of the prompts' tokenization:
                ``add_special_tokens`` (a bool, True by default; False adds no BOS to a text
                prompt, e.g. one rendered with its chat template already;
                :func:`_add_special_tokens`), and vLLM 0.26's ``truncate_prompt_tokens`` (keep
                that many tokens of each prompt, text or ids; -1: ``max_model_len``; None: all)
                with ``truncation_side`` ("left", the default as vLLM's for generative models,
                keeps the last tokens; "right" the first)
                (:func:`_prompt_truncation`). ``SamplingParams.truncate_prompt_tokens`` (earlier
                vLLM's, from the left) applies after it.
            lora_request: vLLM's; None (or a list of None, one per prompt) only, as Surge serves
                no LoRA adapters (:func:`_check_no_lora`).
            mm_processor_kwargs: vLLM's; None or empty only, as Surge serves text-only models.

        Returns:
            One :class:`RequestOutput` per prompt, in order.

        Raises:
            TypeError: ``sampling_params`` is not SamplingParams (or a list of them).
            ValueError: ``tokenization_kwargs`` with another key, an ``add_special_tokens``
                that is not a bool or a bad truncation (:func:`_prompt_truncation`), a ``lora_request`` or ``mm_processor_kwargs`` that asks for something, a prompt
                of another type or with a lone surrogate, a ``priority`` that is
                not one integer per prompt (or not 0 under "fcfs"), a prompt that can
                never fit (a ``max_tokens`` past ``max_model_len`` only ends the output there,
                with ``finish_reason`` "length", as in vLLM's offline API), mismatched list lengths, an invalid
                grammar in ``structured_outputs``, or a ``logit_bias`` / ``allowed_token_ids`` /
                bad-word token id outside the vocabulary.
            RuntimeError: the ``LLM`` is closed (:meth:`close`), prompts of :meth:`enqueue` wait
                (run them with :meth:`wait_for_completion` first), or a grammar compile worker
                died or could not start.

        Whatever exception leaves this call (an engine step that fails, a KeyboardInterrupt)
        first aborts the requests it added, so the engine is left with none of them and the
        next call starts clean.
        """
        self._check_open()
        if self._queued_children:
            raise RuntimeError(
                f"{len(self._queued_results)} prompts were enqueued (enqueue()) and not run: run them "
                "with wait_for_completion() before generate() or chat()"
            )
        results, children = self._submit(
            prompts, sampling_params, priority, tokenization_kwargs, lora_request, mm_processor_kwargs
        )
        self._run_to_end(results, children, use_tqdm, "generate")
        return results

    def _submit(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        priority: Sequence[int] | None,
        tokenization_kwargs: Mapping[str, Any] | None,
        lora_request: object,
        mm_processor_kwargs: Mapping[str, Any] | None,
        added_prompt: Callable[[int], object] | None = None,
    ) -> tuple[list[RequestOutput], dict[str, _Child]]:
        """Check :meth:`generate`'s arguments (its ``Raises``) and add its requests to the engine:
        one :class:`RequestOutput` per prompt (no outputs yet) and the engine requests (choices)
        by id. ``added_prompt(1)`` is called after each prompt is added. A failure aborts the
        requests added so far."""
        add_special_tokens = _add_special_tokens(tokenization_kwargs, default=True)
        truncation = _prompt_truncation(tokenization_kwargs, self.engine.max_model_len)
        _check_no_lora(lora_request)
        _check_no_mm_processor_kwargs(mm_processor_kwargs)
        salted = _as_prompt_list(prompts)
        prompt_list = [prompt for prompt, _ in salted]
        if not self._text_prompts and any(isinstance(p, str) for p in prompt_list):
            raise ValueError(
                f"the model folder {self.engine.config.model.model} has no tokenizer files "
                f"({', '.join(TOKENIZER_FILES)}): give prompts as token ids"
            )
        if sampling_params is None:  # vLLM's: the model's defaults (max_new_tokens as max_tokens)
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        elif isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str | bytes):
            params_list = list(sampling_params)
        else:
            raise TypeError(
                f"sampling_params must be a SamplingParams or a list of them, got {type(sampling_params).__name__}"
            )
        for p in params_list:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams objects, got a {type(p).__name__}")
        if len(params_list) != len(prompt_list):
            raise ValueError("sampling_params must be one object or one per prompt")
        if priority is None:
            priorities = [0] * len(prompt_list)
        elif isinstance(priority, Sequence) and not isinstance(priority, str | bytes):
            priorities = list(priority)
            if len(priorities) != len(prompt_list):
                raise ValueError(
                    f"priority must be one integer per prompt: {len(priorities)} for {len(prompt_list)} prompts"
                )
        else:
            raise ValueError(f"priority must be a list of integers, one per prompt, got {priority!r}")
        for params in params_list:
            if params.structured_outputs is not None:
                from surge.structured.validate import check_structured_outputs

                check_structured_outputs(params.structured_outputs)
        # a copy per distinct object: SamplingParams take vLLM-style assignment, and one made
        # after submitting (before wait_for_completion) must not reach these requests
        copies: dict[int, SamplingParams] = {}
        for p in params_list:
            if id(p) not in copies:
                copies[id(p)] = copy.copy(p)
        params_list = [copies[id(p)] for p in params_list]
        params_list = [self._with_bad_word_ids(p) for p in params_list]
        results: list[RequestOutput] = []
        children: dict[str, _Child] = {}
        added: list[str] = []
        try:
            salts = [salt for _, salt in salted]
            self._add_requests(
                prompt_list,
                params_list,
                salts,
                priorities,
                add_special_tokens,
                truncation,
                results,
                children,
                added,
                added_prompt,
            )
        except BaseException:
            self._abort(added)
            raise
        return results, children

    def _run_to_end(
        self,
        results: list[RequestOutput],
        children: dict[str, _Child],
        use_tqdm: bool | Callable[..., Any],
        desc: str,
    ) -> None:
        """Run the engine until every request of ``children`` has finished and fill ``results``
        with their outputs (by choice index). ``use_tqdm``: :meth:`generate`'s progress bar
        (``desc``: its label). Whatever exception leaves first aborts every request of
        ``children``."""
        try:
            if use_tqdm:
                if callable(use_tqdm):  # the caller's keywords (a partial's desc) stay theirs
                    progress = use_tqdm(total=len(children))
                else:
                    from tqdm import tqdm

                    progress = tqdm(total=len(children), desc=desc, unit="seq")
                with progress as bar:
                    self._run(children, results, bar.update)
            else:
                self._run(children, results)
        except BaseException:
            self._abort(list(children))
            raise
        for child in children.values():
            results[child.parent].outputs.append(
                CompletionOutput(
                    child.index,
                    "" if child.detokenizer is None else child.detokenizer.text,
                    child.token_ids,
                    child.finish_reason,
                    child.stop_reason,
                    child.logprobs,
                )
            )
        for result in results:
            result.outputs.sort(key=lambda o: o.index)

    def enqueue(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: object = None,
        priority: Sequence[int] | None = None,
        use_tqdm: bool | Callable[..., Any] = False,
        tokenization_kwargs: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """vLLM 0.26's: add prompts to the engine without running them; :meth:`wait_for_completion`
        runs every enqueued prompt (of all ``enqueue`` calls, batched together) and returns
        their outputs. The arguments are :meth:`generate`'s, in vLLM's ``enqueue`` order;
        ``use_tqdm`` is a bar over the prompts added (off by default, as :meth:`generate`'s).

        Returns:
            The request id of each prompt, in order: its :attr:`RequestOutput.request_id`.

        Raises:
            As :meth:`generate` (nothing of a call that raises stays enqueued).
        """
        self._check_open()
        if use_tqdm:
            if callable(use_tqdm):
                progress = use_tqdm(total=len(_as_prompt_list(prompts)))
            else:
                from tqdm import tqdm

                progress = tqdm(total=len(_as_prompt_list(prompts)), desc="enqueue", unit="prompt")
            with progress as bar:
                results, children = self._submit(
                    prompts,
                    sampling_params,
                    priority,
                    tokenization_kwargs,
                    lora_request,
                    mm_processor_kwargs,
                    bar.update,
                )
        else:
            results, children = self._submit(
                prompts, sampling_params, priority, tokenization_kwargs, lora_request, mm_processor_kwargs
            )
        offset = len(self._queued_results)
        for child in children.values():
            child.parent += offset
        self._queued_results.extend(results)
        self._queued_children.update(children)
        return [result.request_id for result in results]

    def wait_for_completion(
        self,
        output_type: type | tuple[type, ...] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = False,
    ) -> list[RequestOutput]:
        """vLLM 0.26's: run every prompt of the :meth:`enqueue` calls since the last call to the
        end, batched together, and return their outputs in the order they were enqueued (an empty
        list when none waits).

        Args:
            output_type: vLLM's filter on the output type: None, :class:`RequestOutput` or a tuple
                holding it (Surge's outputs are all ``RequestOutput``: it has no pooling outputs).
            use_tqdm: as :meth:`generate`'s.

        Raises:
            ValueError: an ``output_type`` that leaves ``RequestOutput`` out.
            RuntimeError: the ``LLM`` is closed, or as :meth:`generate` (then every enqueued
                request is aborted: none stays enqueued).
        """
        self._check_open()
        types = output_type if isinstance(output_type, tuple) else (output_type,)
        if output_type is not None and not any(
            isinstance(t, type) and issubclass(RequestOutput, t) for t in types
        ):
            raise ValueError(
                f"wait_for_completion()'s output_type must be None or RequestOutput (Surge's LLM gives no "
                f"pooling outputs), got {output_type!r}"
            )
        results, children = self._queued_results, self._queued_children
        self._queued_results, self._queued_children = [], {}
        self._run_to_end(results, children, use_tqdm, "wait_for_completion")
        return results

    def _add_requests(
        self,
        prompt_list: list[PromptType],
        params_list: list[SamplingParams],
        salts: list[str | None],
        priorities: list[int],
        add_special_tokens: bool,
        truncation: tuple[int, str] | None,
        results: list[RequestOutput],
        children: dict[str, _Child],
        added: list[str],
        added_prompt: Callable[[int], object] | None = None,
    ) -> None:
        """Add one engine request per prompt and choice, appending to ``results`` (one empty
        output per prompt), ``children`` (per request id) and ``added`` (each id the engine took).
        ``salts``: each prompt's ``cache_salt`` (None: none); ``priorities``: each prompt's
        scheduling priority; ``add_special_tokens``: whether text prompts get the tokenizer's
        special tokens (BOS); ``truncation``: :func:`_prompt_truncation`'s (tokens kept, side) or None;
        ``added_prompt(1)``: called after each prompt's requests are added.

        Raises:
            ValueError: a request the engine refuses (see :meth:`LLMEngine.add_request`).
        """
        for i, (prompt, params, salt, priority) in enumerate(
            zip(prompt_list, params_list, salts, priorities, strict=True)
        ):
            token_ids = (
                encode_text(self.tokenizer, prompt, add_special_tokens, splittable=self._splittable)
                if isinstance(prompt, str)
                else list(prompt)
            )
            token_ids = _truncated(token_ids, truncation)
            # the engine truncates too; here first, so that the result reports the prompt it ran
            token_ids = truncated_prompt(
                token_ids,
                params.truncate_prompt_tokens,
                self.engine.max_model_len,
                max_tokens=params.max_tokens,
            )
            # vLLM's offline ids: the decimal count of this LLM's prompts ("0", "1", ...), which
            # scripts sort by (``int(out.request_id)``, as vLLM's own wait_for_completion)
            request_id = str(self._next_id)
            self._next_id += 1
            results.append(
                RequestOutput(
                    request_id,
                    prompt if isinstance(prompt, str) else getattr(prompt, "text", None),
                    token_ids,
                    [],
                )
            )
            room = self.engine.room_for_output(len(token_ids))
            if params.max_tokens and room < max(1, params.min_tokens):
                # max_tokens would be cut to fit: name what cannot be (the prompt, or min_tokens)
                # the limit that binds, alone (both were named, the pool's even where it was not
                # what left no room)
                context, pool = self.engine.max_model_len, self.engine.num_kv_blocks * self.engine.block_size
                limits = (
                    f"this model's maximum context length is {context} tokens"
                    if context <= pool
                    else f"the KV cache holds {pool} tokens (the model's maximum context length is {context})"
                )
                if room < 1:
                    raise ValueError(
                        f"the prompt has {len(token_ids)} tokens: {limits}, which leaves no room for output"
                    )
                raise ValueError(
                    f"the prompt has {len(token_ids)} tokens: {limits}, which leaves {room} for output, "
                    f"less than min_tokens ({params.min_tokens})"
                )
            params = self._reasoning_gate(params, token_ids)
            if params.max_tokens is not None and max(1, params.min_tokens) <= room < params.max_tokens:
                # as vLLM's offline LLM: generation ends at the context limit ("length"), here also
                # at what the KV pool holds, as for an unset max_tokens; less room than min_tokens
                # is refused by the engine. The server refuses both, as vLLM's server does.
                params = msgspec.structs.replace(params, max_tokens=room)
            # once for all n children (they share the stop ids): a set per child of 150,000
            # stop_token_ids took 1.5 s for n=128
            stop_ids = reported_stop_ids(params, self.engine.config.model.eos_token_ids, self._primary_eos)
            for index, (child_id, child_params) in enumerate(split_n(request_id, params)):
                if index > 0 and child_params.prompt_logprobs is not None:
                    # The prompt's logprobs are the same for every child: the first computes them.
                    child_params = msgspec.structs.replace(child_params, prompt_logprobs=None)
                self.engine.add_request(child_id, token_ids, child_params, cache_salt=salt, priority=priority)
                added.append(child_id)
                detok = (
                    IncrementalDetokenizer.for_params(self.tokenizer, token_ids, child_params)
                    if child_params.detokenize
                    else None  # vLLM's detokenize=False: no text, no decoded logprob tokens
                )
                children[child_id] = _Child(
                    i,
                    index,
                    detok,
                    self.token_strings.text if child_params.detokenize else None,
                    [],
                    stop_ids=stop_ids,
                    logprobs=[] if child_params.num_logprobs is not None else None,
                )
            if added_prompt is not None:
                added_prompt(1)

    def _reasoning_gate(self, params: SamplingParams, prompt_token_ids: list[int]) -> SamplingParams:
        """``params`` whose grammar waits for the reasoning's end, as vLLM's ``LLM(...,
        reasoning_parser=...)`` constrains only the answer (:func:`wait_for_reasoning_end`, the
        rule the server's ``/v1/completions`` shares)."""
        return wait_for_reasoning_end(params, self.engine.config.reasoning_tokens, prompt_token_ids)

    def _abort(self, request_ids: list[str]) -> None:
        """Abort ``request_ids`` (a :meth:`generate` that raised) and settle the step in
        flight, so that the engine holds nothing of them. A failure of that step is logged, not
        raised: the caller re-raises the exception that got it here."""
        self.engine.abort_requests(request_ids)
        try:
            self.engine.finish_in_flight()
        except Exception:
            logger.warning("the step in flight failed while aborting a generate() call", exc_info=True)
        self.engine.take_request_errors()  # errors of these requests, recorded before the raise

    def _with_bad_word_ids(self, params: SamplingParams) -> SamplingParams:
        """``params`` with its ``bad_words`` tokenized and added to ``bad_words_token_ids`` (both
        apply: ``bad_words`` was dropped when ids were given too)."""
        if not params.bad_words:
            return params
        ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        given = [tuple(w) for w in params.bad_words_token_ids]
        merged = given + [tuple(w) for w in ids if tuple(w) not in given]
        return msgspec.structs.replace(params, bad_words_token_ids=tuple(merged))

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (transformers), as vLLM's ``LLM.get_tokenizer``."""
        return self.tokenizer

    def get_world_size(self, include_dp: bool = True) -> int:
        """vLLM's: how many GPUs (ranks) the model runs on, its ``tensor_parallel_size``. The
        offline ``LLM`` runs one engine (no data parallelism, as vLLM's ``LLM``), so
        ``include_dp`` changes nothing.

        Raises:
            TypeError: ``include_dp`` is not a bool.
        """
        if not isinstance(include_dp, bool):
            raise TypeError(f"get_world_size()'s include_dp must be a bool, got {include_dp!r}")
        return self.engine.config.parallel.tensor_parallel_size

    def get_metrics(self) -> list[Metric]:
        """vLLM's: a snapshot of the engine's metrics under vLLM's names, as
        :mod:`surge.metrics_reader` objects labelled ``model_name`` (the model folder) and
        ``engine`` ("0"): the gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``
        and ``vllm:kv_cache_usage_perc`` (0..1), and the counters since the ``LLM`` started
        ``vllm:num_preemptions``, ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits``
        (prompt tokens), ``vllm:prompt_tokens`` and ``vllm:generation_tokens`` (of finished
        requests) and ``vllm:request_success`` (finished requests, by ``finished_reason``; each of
        ``n`` choices is one request). vLLM's histograms are left out: the offline ``LLM``
        keeps no per-request timings. It counts whatever ``disable_log_stats`` says (vLLM's
        needs False).
        """
        from surge.metrics_reader import Counter, Gauge

        stats = self.engine.get_stats()
        model = self.engine.config.model.model

        def labels(**more: str) -> dict[str, str]:  # each metric its own dict
            return {"model_name": model, "engine": "0", **more}

        metrics: list[Metric] = [
            Gauge("vllm:num_requests_running", labels(), float(stats.num_running)),
            Gauge("vllm:num_requests_waiting", labels(), float(stats.num_waiting)),
            Gauge("vllm:kv_cache_usage_perc", labels(), stats.kv_cache_usage),
            Counter("vllm:num_preemptions", labels(), stats.num_preemptions_total),
            Counter("vllm:prefix_cache_queries", labels(), stats.prefix_cache_query_tokens),
            Counter("vllm:prefix_cache_hits", labels(), stats.prefix_cache_hit_tokens),
            Counter("vllm:prompt_tokens", labels(), self._prompt_tokens),
            Counter("vllm:generation_tokens", labels(), self._generation_tokens),
        ]
        metrics += [
            Counter("vllm:request_success", labels(finished_reason=reason), count)
            for reason, count in self._finished.items()
        ]
        return metrics

    def reset_mm_cache(self) -> None:
        """vLLM's: forget cached multimodal inputs. Surge serves text-only models and keeps no
        such cache, so there is nothing to forget: a script's call does nothing."""

    def __getattr__(self, name: str) -> Any:
        """Called only for a name that ``LLM`` lacks: for a method or attribute of vLLM's ``LLM``
        that Surge does without (``beam_search``, ``embed``, ``sleep``, ``llm_engine``, ...:
        :data:`_VLLM_ONLY_MEMBERS`), the ``AttributeError`` says why and what to use instead.
        It stays an ``AttributeError``, so ``hasattr(llm, "beam_search")`` is False, as code
        that probes vLLM's features expects."""
        hint = _VLLM_ONLY_MEMBERS.get(name)
        if hint is None:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self
            )
        raise AttributeError(f"Surge's LLM has no {name!r} (vLLM's LLM.{name}): {hint}", name=name, obj=self)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = False,
        lora_request: object = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to one conversation (a list of messages) or to a list of
        conversations, and generate one reply per conversation (like vLLM's ``LLM.chat``, whose
        argument order this keeps).

        ``tools`` (OpenAI function definitions) are rendered by the template; parse the calls
        in the replies with :mod:`surge.server.parsers` (e.g. ``HermesToolParser``), or force
        them with ``structured_outputs`` (see docs/structured-outputs.md). ``chat_template``
        replaces the tokenizer's (None: the ``LLM``'s own ``chat_template``, if it was given one); ``add_generation_prompt`` and ``continue_final_message`` are
        the template's (:func:`surge.tokenizer.apply_chat_template`); ``use_tqdm`` is
        :meth:`generate`'s, and so are ``lora_request`` and ``mm_processor_kwargs`` (None only).
        ``chat_template_content_format``: vLLM's "string" (each message's content reaches the
        template as one string, its text parts joined by newlines), "openai" (a list of
        ``{"type": "text", "text": ...}`` parts; a string content is one part) or "auto" (the
        template's own, read from its syntax tree as vLLM does and logged at its first use:
        "openai" for a template that loops over ``message['content']``, "string" otherwise, as
        for the Qwen and Llama 3 templates; :mod:`surge.chat_content_format`).
        ``tokenization_kwargs``: as in :meth:`generate`, applied to the rendered text
        (``add_special_tokens`` by default: none for a template, which writes its own; the
        tokenizer's for the fallback without one, as vLLM's chat defaults; a truncation cuts the
        rendered prompt's tokens, the reported ``prompt`` text stays whole).

        Returns:
            One :class:`RequestOutput` per conversation, in order; its ``prompt`` is the
            templated text.

        Raises:
            ValueError: as :meth:`generate`, a template that cannot render the messages, or a
                ``chat_template_content_format`` other than "auto", "string" or "openai".
            RuntimeError: the ``LLM`` is closed.
        """
        self._check_open()
        prompts, texts = self._render_chat(
            messages,
            chat_template,
            chat_template_content_format,
            add_generation_prompt,
            continue_final_message,
            tools,
            chat_template_kwargs,
            tokenization_kwargs,
            lora_request,
            mm_processor_kwargs,
        )
        results = self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        for result, text in zip(results, texts, strict=True):
            result.prompt = text
        return results

    def enqueue_chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = False,
        lora_request: object = None,
        priority: Sequence[int] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """vLLM 0.26's: :meth:`chat`'s conversations rendered and added as :meth:`enqueue` adds
        prompts (``priority`` is :meth:`generate`'s, one per conversation; ``use_tqdm`` a bar over
        the conversations added); :meth:`wait_for_completion` runs them, each output's ``prompt``
        the templated text, as :meth:`chat`'s. The arguments are in vLLM's ``enqueue_chat``
        order.

        Returns:
            The request id of each conversation, in order.

        Raises:
            As :meth:`chat` (nothing of a call that raises stays enqueued).
        """
        self._check_open()
        prompts, texts = self._render_chat(
            messages,
            chat_template,
            chat_template_content_format,
            add_generation_prompt,
            continue_final_message,
            tools,
            chat_template_kwargs,
            tokenization_kwargs,
            lora_request,
            mm_processor_kwargs,
        )
        ids = self.enqueue(prompts, sampling_params, priority=priority, use_tqdm=use_tqdm)
        if ids:
            for result, text in zip(self._queued_results[-len(ids) :], texts, strict=True):
                result.prompt = text
        return ids

    def _render_chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        chat_template: str | None,
        chat_template_content_format: str,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None,
        tokenization_kwargs: Mapping[str, Any] | None,
        lora_request: object,
        mm_processor_kwargs: Mapping[str, Any] | None,
    ) -> tuple[list[PromptType], list[str]]:
        """:meth:`chat`'s checks and its conversations rendered: each one's prompt (as
        :meth:`generate` takes it) and its templated text."""
        check_content_format(chat_template_content_format)
        add_special_tokens = _add_special_tokens(tokenization_kwargs, default=None)
        truncation = _prompt_truncation(tokenization_kwargs, self.engine.max_model_len)
        _check_no_lora(lora_request)
        _check_no_mm_processor_kwargs(mm_processor_kwargs)
        if not self._text_prompts:
            raise ValueError(
                f"the model folder {self.engine.config.model.model} has no tokenizer files: chat needs one"
            )
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        template = self.chat_template if chat_template is None else chat_template
        self._log_content_format(
            chat_template_content_format, described_chat_template(self.tokenizer, template, tools)
        )
        texts: list[str] = []  # each conversation's rendered template, as vLLM's prompt
        prompts: list[PromptType] = [
            apply_chat_template(
                self.tokenizer,
                conv,  # type: ignore[arg-type]
                chat_template=template,
                chat_template_kwargs=chat_template_kwargs,
                check_text=texts.append,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                add_special_tokens=add_special_tokens,
                splittable=self._splittable,
                content_format=chat_template_content_format,
            )
            for conv in conversations
        ]
        if truncation is not None:
            prompts = [_truncated(list(p), truncation) for p in prompts]
        return prompts, texts

    def _log_content_format(self, option: str, template: str | None) -> None:
        """Log the content format ``template`` is rendered with under ``option`` once per
        ``LLM``, template and option (:func:`surge.chat_content_format.describe_content_format`:
        what ``auto`` detected, or a given format the template does not read), as vLLM's
        ``LLM.chat`` logs it at its first use of a template."""
        if (option, template) in self._content_formats_logged:
            return
        self._content_formats_logged.add((option, template))
        line = describe_content_format(option, template, "the chat template")
        if line is not None:
            logger.log(*line)

    def _run(
        self,
        children: dict[str, _Child],
        results: list[RequestOutput],
        finished: Callable[[int], object] | None = None,
    ) -> None:
        """Step the engine until every request of ``children`` has finished, filling each
        child's tokens, text and logprobs and ``results``' prompt fields; ``finished(1)`` is
        called per finished request. Returns with the engine idle: no step in flight.

        Raises:
            ValueError: a request ended with an error (a grammar refused: status 4xx).
            RuntimeError: a request ended with a server-side error (a grammar compile worker
                failed), or as the executor raises.
        """
        pending = set(children)
        while pending:
            outputs = self.engine.step()
            errors = self.engine.take_request_errors()
            if errors:  # generate() aborts the call's requests
                raise (ValueError if errors[0].status < 500 else RuntimeError)(errors[0].message)
            if not outputs and not self.engine.has_unfinished_requests():
                break
            for out in outputs:
                child = children.get(out.request_id)
                if child is None or child.finish_reason is not None:
                    continue
                child.token_ids.extend(out.new_token_ids)
                if child.logprobs is not None and out.logprobs is not None:
                    child.logprobs.extend(position_logprobs(out.logprobs, child.decode))
                if out.prompt_logprobs is not None:
                    result = results[child.parent]
                    result.prompt_logprobs = [None]
                    result.prompt_logprobs += position_logprobs(out.prompt_logprobs, child.decode)
                detokenizer = child.detokenizer
                if detokenizer is not None:
                    detokenizer.update(out.new_token_ids, out.stop_token_id)
                results[child.parent].num_cached_tokens = max(
                    results[child.parent].num_cached_tokens, out.num_cached_tokens
                )
                if detokenizer is not None and detokenizer.stop_matched is not None:
                    self.engine.abort_requests([out.request_id])
                    child.finish_reason = "stop"
                    child.stop_reason = detokenizer.stop_matched
                elif out.finish_reason is not None:
                    child.finish_reason = out.finish_reason
                    child.stop_reason = stop_reason_of(out.stop_token_id, child.stop_ids, out.finish_reason)
                if child.finish_reason is not None:
                    if detokenizer is not None:
                        detokenizer.flush()
                    self._prompt_tokens += len(results[child.parent].prompt_token_ids)
                    self._generation_tokens += len(child.token_ids)
                    self._finished[child.finish_reason] = self._finished.get(child.finish_reason, 0) + 1
                    pending.discard(out.request_id)
                    if finished is not None:
                        finished(1)
        # Under asynchronous scheduling the step after the last one applied was launched before
        # its requests were known to end (an EOS or stop token id, a stop string): wait for it
        # and apply it now, so that the call returns with the engine idle, as vLLM's offline
        # loop (its engine core steps until its batch queue is empty). Each of its tokens is of
        # a finished request: nothing of it is reported.
        self.engine.finish_in_flight()


def _token_ids(p: Any) -> list[int] | None:
    """``p`` as a list of token ids when it is a list or tuple of integers (NumPy integers too,
    as ``SamplingParams`` takes them; never a bool), else None."""
    if isinstance(p, list | tuple) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in p
    ):
        return [int(t) for t in p]
    return None


class TextedTokenIds(list[int]):
    """A prompt of token ids given with its text (vLLM's ``TokensPrompt`` with ``prompt``): the
    ids are what runs; ``text`` is reported as :attr:`RequestOutput.prompt`, not tokenized."""

    def __init__(self, token_ids: list[int], text: str) -> None:
        super().__init__(token_ids)
        self.text = text


_TEXT_ONLY_KEYS = frozenset({"multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids"})
"""Optional keys of vLLM's ``TextPrompt`` / ``TokensPrompt`` for multimodal models: taken when
absent, None or empty."""

_LLM_ONLY_HINTS = {
    "served_model_name": "nothing: the offline API names no model",
    "task": "nothing: Surge's LLM generates text, and vLLM 0.26 has no 'task' either (its runner=\"generate\")",
    "max_loras": "nothing: Surge serves no LoRA adapters (merge the adapter into the model's weights)",
    "max_lora_rank": "nothing: Surge serves no LoRA adapters (merge the adapter into the model's weights)",
}
"""vLLM ``LLM(...)`` arguments whose hint in :data:`surge.cli.VLLM_FLAG_HINTS` speaks of the
command line (or that have none there), and what to use instead."""


_POOLING = (
    "Surge serves generative models only: it has no pooling runner (embeddings, classification, scores)"
)
_WEIGHTS = "Surge loads the weights once, from the model folder: save new weights to a folder and make a new LLM on it"
_VLLM_ONLY_MEMBERS: dict[str, str] = {
    "beam_search": (
        "Surge has no beam search; sample candidates with SamplingParams(n=k, logprobs=0) and keep "
        "the one of highest cumulative_logprob"
    ),
    "encode": _POOLING,
    "embed": _POOLING,
    "classify": _POOLING,
    "score": _POOLING,
    "reward": _POOLING,
    "sleep": "Surge cannot free a live LLM's GPU memory: close() it, drop it (del llm) and make a new one",
    "wake_up": "Surge has no sleep mode: make a new LLM where vLLM's script wakes one up",
    "start_profile": (
        "Surge has no built-in profiler: wrap generate() in torch.profiler.profile() (one GPU) or run "
        "the script under nsys"
    ),
    "stop_profile": "Surge has no built-in profiler (see start_profile)",
    "collective_rpc": "Surge runs no caller's function in its engine or workers",
    "apply_model": "Surge runs no caller's function on its model",
    "init_weight_transfer_engine": _WEIGHTS,
    "start_weight_update": _WEIGHTS,
    "start_draft_weight_update": _WEIGHTS,
    "update_weights": _WEIGHTS,
    "finish_weight_update": _WEIGHTS,
    "llm_engine": (
        "Surge's engine is llm.engine (its own LLMEngine, without vLLM's API): its settings are "
        "llm.engine.config (e.g. llm.engine.config.model.max_model_len), the tokenizer is llm.get_tokenizer()"
    ),
    "model_config": (
        "Surge's model settings are llm.engine.config.model (its own ModelConfig, without vLLM's API: "
        "e.g. llm.engine.config.model.max_model_len), the tokenizer is llm.get_tokenizer()"
    ),
    "set_tokenizer": (
        "Surge reads the model folder's own tokenizer: copy the tokenizer files into the model folder "
        "and make the LLM on it"
    ),
}
"""Public methods and attributes of vLLM 0.26's ``LLM`` (and the earlier ``reward`` and
``set_tokenizer``) that Surge's lacks, and why or what to use instead (:meth:`LLM.__getattr__`'s
message)."""


_VLLM_DEFAULT_ONLY: dict[str, tuple[tuple[object, ...], str]] = {
    "runner": (("auto", "generate"), "Surge's LLM generates text only (no pooling or draft runner)"),
    "convert": (("auto", "none"), "Surge converts no model into a pooling model"),
    "pipeline_parallel_size": (
        (1,),
        "Surge has no pipeline parallelism: shard the model with tensor_parallel_size instead",
    ),
    "data_parallel_size": (
        (1,),
        "the offline LLM runs one engine (vLLM's refuses more too): serve replicas with `surge serve -dp N`",
    ),
    "revision": (
        (None,),
        "Surge loads a local model folder only: download that revision and give its folder as model",
    ),
    "tokenizer_revision": (
        (None,),
        "Surge reads the model folder's own tokenizer: put that revision's tokenizer files in it",
    ),
    "compilation_config": (
        (None, 0, {}),  # 0: vLLM's CompilationMode.NONE; {}: its defaults
        "Surge runs no torch.compile: its CUDA graphs are its own (enforce_eager=True turns them off)",
    ),
    "enable_lora": (
        (False,),
        "Surge serves no LoRA adapters: merge the adapter into the model's weights and load that folder",
    ),
    "speculative_config": ((None,), "Surge has no speculative decoding"),
    "kv_cache_memory_bytes": (
        (None,),
        "size the KV cache with num_kv_blocks=N (N blocks of block_size tokens)",
    ),
    "cpu_offload_gb": ((0, 0.0), "Surge keeps every weight on the device"),
    "hf_token": ((None, False), "Surge loads local model folders only and never downloads"),
    "limit_mm_per_prompt": ((None, {}), "Surge serves text-only models"),
    "mm_processor_kwargs": ((None, {}), "Surge serves text-only models"),
    "disable_custom_all_reduce": (
        (True,),
        'Surge\'s default tp_all_reduce="nccl" is NCCL only; tp_all_reduce="auto" adds its own one-shot all-reduce',
    ),
    "distributed_executor_backend": (
        (None, "mp"),
        'Surge runs its tensor-parallel workers as processes it spawns itself (vLLM\'s "mp")',
    ),
    "trust_remote_code": (
        (False,),
        "Surge runs its own code for the supported architectures, never a model folder's, so the "
        "permission would change nothing: leave it out",
    ),
    "tokenizer_mode": (
        ("auto", "hf"),
        "the model folder's tokenizer is loaded by transformers' AutoTokenizer (vLLM's \"hf\")",
    ),
    "skip_tokenizer_init": (
        (False,),
        "Surge loads the model folder's tokenizer when it has one; a folder without tokenizer files "
        "takes token-id prompts, and SamplingParams(detokenize=False) gives outputs without text",
    ),
    "enable_chunked_prefill": ((None, True), "Surge's chunked prefill is always on"),
    "max_logprobs": ((20,), "logprobs and prompt_logprobs take up to 20 (vLLM's default)"),
    "logits_processors": (
        (None, []),
        "Surge runs no custom logits processors: use SamplingParams' logit_bias, allowed_token_ids, "
        "bad_words or structured_outputs",
    ),
}
"""vLLM ``LLM(...)`` arguments that Surge takes only at a value that asks for nothing beyond
what it does (vLLM's default, or its equivalent): the accepted values and, for any other, why
not and what to use instead (:func:`_check_vllm_default`)."""


def _load_chat_template(chat_template: object) -> str | None:
    """``LLM(chat_template=...)``'s template text: a file's text, or the value itself when it
    looks like a template (:func:`surge.server.cli._read_chat_template`), or None.

    Raises:
        ValueError: not a string, path or None; a file that cannot be read, a value that is
            neither a file nor a template, or a template that does not parse.
    """
    if chat_template is None:
        return None
    if not isinstance(chat_template, str | Path):
        raise ValueError(
            f"chat_template must be a template file's path, the template text or None, "
            f"got {type(chat_template).__name__}"
        )
    from surge.server.cli import _read_chat_template

    return _read_chat_template(str(chat_template), name="chat_template")


def _check_vllm_default(name: str, value: object) -> None:
    """Take vLLM's ``LLM(name=value)`` when ``value`` is one of :data:`_VLLM_DEFAULT_ONLY`'s
    for ``name`` (of the same type: ``True`` is not ``1``).

    Raises:
        ValueError: another value, with the reason and what to use instead.
    """
    accepted, reason = _VLLM_DEFAULT_ONLY[name]
    if any(value is ok or (type(value) is type(ok) and value == ok) for ok in accepted):
        return
    shown = ", ".join(repr(ok) for ok in accepted[:-1]) + " or " * (len(accepted) > 1) + repr(accepted[-1])
    raise ValueError(f"LLM() takes vLLM's {name!r} only as {shown}, got {value!r}: {reason}")


def _add_special_tokens(tokenization_kwargs: object, *, default: bool | None) -> bool | None:
    """The ``add_special_tokens`` of vLLM's ``generate(..., tokenization_kwargs=...)`` (and
    ``chat``'s): ``default`` when it is None or leaves the key out.

    Raises:
        ValueError: not a dict, a key other than ``add_special_tokens``, ``truncate_prompt_tokens``
            and ``truncation_side`` (:func:`_prompt_truncation`'s; vLLM's ``truncation``,
            ``max_length`` and ``padding`` are refused), or a value that is not a bool.
    """
    if tokenization_kwargs is None:
        return default
    if not isinstance(tokenization_kwargs, Mapping):
        raise ValueError(f"tokenization_kwargs must be a dict, got {type(tokenization_kwargs).__name__}")
    others = sorted(map(str, set(tokenization_kwargs) - _TOKENIZATION_KEYS))
    if others:
        raise ValueError(
            f"tokenization_kwargs takes only 'add_special_tokens', 'truncate_prompt_tokens' and "
            f"'truncation_side', got {others} (truncate a prompt with "
            "tokenization_kwargs={'truncate_prompt_tokens': k})"
        )
    if "add_special_tokens" not in tokenization_kwargs:
        return default
    value = tokenization_kwargs["add_special_tokens"]
    if not isinstance(value, bool):
        raise ValueError(f"tokenization_kwargs['add_special_tokens'] must be a bool, got {value!r}")
    return value


_TOKENIZATION_KEYS = frozenset({"add_special_tokens", "truncate_prompt_tokens", "truncation_side"})
"""The ``tokenization_kwargs`` keys of vLLM 0.26 that Surge takes."""


def _prompt_truncation(tokenization_kwargs: object, max_model_len: int) -> tuple[int, str] | None:
    """vLLM 0.26's ``tokenization_kwargs`` truncation: ``(tokens to keep, side)``, or None for none.
    ``truncate_prompt_tokens`` -1 keeps ``max_model_len`` tokens; ``truncation_side`` None (or
    left out) is "left", the last tokens stay (vLLM's ``TokenizeParams._token_truncation`` falls
    back to the tokenizer's side, which vLLM's ``get_tokenizer`` sets to "left" for generative
    models).
    Other keys are :func:`_add_special_tokens`'s to check.

    Raises:
        ValueError: ``truncate_prompt_tokens`` that is not an integer >= -1 or None, or is over
            ``max_model_len`` (vLLM's limit offline); ``truncation_side`` that is not "left",
            "right" or None.
    """
    if not isinstance(tokenization_kwargs, Mapping):
        return None
    side = tokenization_kwargs.get("truncation_side")
    if side not in (None, "left", "right"):
        raise ValueError(
            f"tokenization_kwargs['truncation_side'] must be 'left', 'right' or None, got {side!r}"
        )
    keep = tokenization_kwargs.get("truncate_prompt_tokens")
    if keep is None:
        return None
    if not isinstance(keep, numbers.Integral) or isinstance(keep, bool) or keep < -1:
        raise ValueError(
            f"tokenization_kwargs['truncate_prompt_tokens'] must be an integer >= -1 or None, got {keep!r}"
        )
    if keep > max_model_len:
        raise ValueError(
            f"tokenization_kwargs['truncate_prompt_tokens'] ({keep}) cannot be greater than max_model_len "
            f"({max_model_len})"
        )
    return (max_model_len if keep == -1 else int(keep)), side or "left"


def _truncated(token_ids: list[int], truncation: tuple[int, str] | None) -> list[int]:
    """``token_ids`` cut to :func:`_prompt_truncation`'s ``(keep, side)``: the last ``keep``
    tokens for "left", the first for "right"; unchanged when they fit or ``truncation`` is None."""
    if truncation is None or len(token_ids) <= truncation[0]:
        return token_ids
    keep, side = truncation
    return token_ids[len(token_ids) - keep :] if side == "left" else token_ids[:keep]


def _check_no_lora(lora_request: object) -> None:
    """Take vLLM's ``lora_request`` when it asks for no adapter: None, or a list (tuple) of None
    (one per prompt).

    Raises:
        ValueError: anything else: Surge serves no LoRA adapters.
    """
    if lora_request is None:
        return
    if isinstance(lora_request, list | tuple) and all(r is None for r in lora_request):
        return
    raise ValueError(
        "lora_request is not supported: Surge serves no LoRA adapters (merge the adapter into the "
        "model's weights and load that folder, or leave lora_request None)"
    )


def _check_no_mm_processor_kwargs(mm_processor_kwargs: object) -> None:
    """Take vLLM's ``mm_processor_kwargs`` when None or empty.

    Raises:
        ValueError: anything else: Surge serves text-only models, with no multimodal processor.
    """
    if mm_processor_kwargs is None or (isinstance(mm_processor_kwargs, Mapping) and not mm_processor_kwargs):
        return
    raise ValueError("mm_processor_kwargs is not supported: Surge serves text-only models (leave it None)")


def _check_tokenizer_folder(tokenizer: object, model_dir: str) -> None:
    """Refuse a vLLM ``LLM(tokenizer=...)`` that is not None or ``model_dir`` (the same folder,
    however spelled): the model folder's own tokenizer is the one Surge reads.

    Raises:
        ValueError: another folder, or a value that is not a path.
    """
    if tokenizer is None:
        return
    if not isinstance(tokenizer, str | Path):
        raise ValueError(f"tokenizer must be a folder path or None, got {type(tokenizer).__name__}")
    if Path(tokenizer).expanduser().resolve() != Path(model_dir).resolve():
        raise ValueError(
            f"tokenizer {str(tokenizer)!r} is not the model folder {model_dir}: Surge reads the model "
            "folder's own tokenizer; copy the tokenizer files into it and leave tokenizer out"
        )


def _unexpected_argument(name: str) -> str:
    """The TypeError message for ``LLM(name=...)``: for an argument of vLLM's ``LLM`` that Surge
    does without (``swap_space``, ``task``, ...), what to use instead. A command-line
    hint that names flags (``--top-k``'s ``--extra-body``) is no use to a Python caller: such a name
    gets Python's own message."""
    from surge.cli import VLLM_FLAG_HINTS

    hint = _LLM_ONLY_HINTS.get(name) or VLLM_FLAG_HINTS.get("--" + name.replace("_", "-"))
    if hint is None or "--" in hint:
        return f"LLM() got an unexpected keyword argument {name!r}"
    if hint.startswith("nothing: "):
        return f"LLM() does not take vLLM's {name!r}: leave it out ({hint.removeprefix('nothing: ')})"
    return f"LLM() does not take vLLM's {name!r}: use {hint}"


def _prompt_of(p: Any) -> tuple[PromptType, str | None]:
    """One prompt and its ``cache_salt``: a string, a list (or tuple) of token ids, or vLLM's
    ``{"prompt": str}`` / ``{"prompt_token_ids": [int]}`` dict (``TextPrompt`` / ``TokensPrompt``;
    a tokens prompt may carry its ``prompt`` text, which is not tokenized but reported:
    :class:`TextedTokenIds`; the multimodal keys may be there when empty). A dict's
    ``cache_salt`` is a string (None or ``""``: no salt, as in vLLM's offline API); only prompts
    with the same salt share prefix-cache blocks. Raises ValueError for anything else (a salt
    that is not a string too), or a string that is not valid Unicode text (a lone surrogate)."""
    salt = None
    if isinstance(p, dict):
        keys = set(p)
        for name in _TEXT_ONLY_KEYS & keys:  # vLLM's optional keys: absent or empty here
            if p[name]:
                raise ValueError(f"a dict prompt's {name!r} is not supported: Surge serves text-only models")
            keys.discard(name)
        if "cache_salt" in keys:
            salt = p["cache_salt"]
            if salt is not None and not isinstance(salt, str):
                raise ValueError(f"a dict prompt's 'cache_salt' must be a string, got {type(salt).__name__}")
            salt = salt or None
            keys.discard("cache_salt")
        if keys == {"prompt", "prompt_token_ids"}:  # vLLM's TokensPrompt with its text
            if not isinstance(p["prompt"], str):
                raise ValueError(
                    f"a dict prompt's 'prompt' must be a string, got {type(p['prompt']).__name__}"
                )
            ids = _token_ids(p["prompt_token_ids"])
            if ids is None:
                raise ValueError("a dict prompt's 'prompt_token_ids' must be a list of integers")
            return TextedTokenIds(ids, p["prompt"]), salt
        if keys == {"prompt"}:
            if not isinstance(p["prompt"], str):
                raise ValueError(
                    f"a dict prompt's 'prompt' must be a string, got {type(p['prompt']).__name__}"
                )
            p = p["prompt"]
        elif keys == {"prompt_token_ids"}:
            ids = _token_ids(p["prompt_token_ids"])
            if ids is None:
                raise ValueError("a dict prompt's 'prompt_token_ids' must be a list of integers")
            return ids, salt
        else:
            raise ValueError(
                f"a dict prompt must be {{'prompt': str}} or {{'prompt_token_ids': [int]}}, got keys {sorted(keys)}"
            )
    if isinstance(p, str):
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a prompt holds a lone surrogate (not valid Unicode text)") from None
        return p, salt
    ids = _token_ids(p)
    if ids is not None:
        return ids, None
    raise ValueError(
        "each prompt must be a string, a list of integer token ids, or a {'prompt'/'prompt_token_ids': ...} dict; "
        f"got {type(p).__name__}"
    )


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[tuple[PromptType, str | None]]:
    """Each prompt of ``prompts`` with its ``cache_salt`` (:func:`_prompt_of`)."""
    if isinstance(prompts, str | dict):
        return [_prompt_of(prompts)]
    if isinstance(prompts, bytes | bytearray | memoryview) or not isinstance(prompts, Iterable):
        # bytes iterate as ints: they were taken for token ids
        raise ValueError(
            "prompts must be a string, a list of token ids, a {'prompt'/'prompt_token_ids': ...} dict, or a "
            f"list of those; got {type(prompts).__name__}"
        )
    items = list(prompts)
    ids = _token_ids(items)
    if items and ids is not None:
        return [(ids, None)]
    return [_prompt_of(p) for p in items]
