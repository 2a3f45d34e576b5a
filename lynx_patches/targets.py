"""Every SGLang 0.5.23 name Lynx hooks or relies on, in one place (see docs/ARCHITECTURE.md)."""

SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
SERVER_ARGS_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"
GET_KV_CLASS = "sglang.srt.disaggregation.utils.get_kv_class"
PREFILL_INIT_KV_MANAGER = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue._init_kv_manager"
DECODE_INIT_KV_MANAGER = "sglang.srt.disaggregation.decode.DecodePreallocQueue._init_kv_manager"
SCHEDULER_INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
PREFILL_RESULT = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_prefill"
)
DECODE_SEND_KV_METADATA = "sglang.srt.disaggregation.decode.DecodePreallocQueue._send_kv_metadata"
DECODE_COMMIT_TRANSFER = "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req"
TOKENIZER_META_INFO = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
DECODE_NEXT_BATCH = (
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run"
)
PREFILL_NEXT_BATCH = (
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run"
)
SCHEDULER_HANDLE_GENERATE = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"
SCHEDULER_IS_FULLY_IDLE = "sglang.srt.managers.scheduler.Scheduler.is_fully_idle"
SCHEDULER_ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
SCHEDULER_INFLIGHT_REQS = "sglang.srt.managers.scheduler.Scheduler.collect_inflight_reqs"
DECODE_NEW_PREBUILT_BATCH = "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch"
TORCH_NATIVE_EXTEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
TOKENIZER_SEND_ONE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request"
STREAM_ACCEPT = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
REQ_UPDATE_FINISH_STATE = "sglang.srt.managers.schedule_batch.Req.update_finish_state"
SAMPLER_FORWARD = "sglang.srt.layers.sampler.Sampler.forward"
MOONCAKE_SENDER_INIT = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
SCHEDULER_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
MHA_SET_KV_BUFFER = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer"

# The logprob lists of a request (`Req().logprob`) that a rollback truncates.
LOGPROB_LISTS = (
    "output_token_logprobs_val",
    "output_token_logprobs_idx",
    "output_top_logprobs_val",
    "output_top_logprobs_idx",
    "output_token_ids_logprobs_val",
    "output_token_ids_logprobs_idx",
)

# SGLang names Lynx calls, reads, sets or overrides without hooking them, in
# the forms `lynx_patches.selfcheck.resolves` reads: ``Owner.name``,
# ``Owner.method(param, ...)`` and ``Class().attribute`` (an attribute SGLang
# gives its instances). The start-up self-check resolves each one, so an
# SGLang that renamed one refuses `--lynx` at start-up instead of failing
# requests later (or, for an attribute Lynx sets, silently doing nothing).
_COMMON = "sglang.srt.disaggregation.common.conn"
_DECODE = "sglang.srt.disaggregation.decode"
_PREFILL = "sglang.srt.disaggregation.prefill"
_BATCH = "sglang.srt.managers.schedule_batch"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_COMPONENTS = "sglang.srt.managers.scheduler_components"
_POOL = "sglang.srt.mem_cache.memory_pool"
_ALLOCATOR = "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator"
_GRAMMAR = "sglang.srt.constrained.base_grammar_backend.BaseGrammarObject"
_LOGITS = "sglang.srt.layers.logits_processor"
_FORWARD = "sglang.srt.model_executor.forward_batch_info"
_SAMPLING_INFO = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo"
_PARAMS = "sglang.srt.sampling.sampling_params.SamplingParams"
_PENALTIES = "sglang.srt.sampling.penaltylib"


def _members(owner: str, names: str) -> tuple[str, ...]:
    """``owner.name`` for each of the space-separated `names`."""
    return tuple(f"{owner}.{name}" for name in names.split())


def _instance(cls: str, names: str) -> tuple[str, ...]:
    """``cls().name`` (an attribute SGLang gives instances of `cls`) for each of the space-separated `names`."""
    return tuple(f"{cls}().{name}" for name in names.split())


USED = (
    # The PD manager, sender and receiver Lynx subclasses (lynx_patches.pd).
    f"{_COMMON}.CommonKVManager.__init__(args, disaggregation_mode, server_args, is_mla_backend)",
    f"{_COMMON}.CommonKVManager._encode_kv_status_message(bootstrap_room, status, failure_reason)",
    f"{_COMMON}.CommonKVManager.send_kv_status_message(targets, bootstrap_room, status, failure_reason)",
    f"{_COMMON}.CommonKVManager._handle_node_failure(failed_bootstrap_addr)",
    f"{_COMMON}.CommonKVManager.update_status(bootstrap_room, status)",
    (
        f"{_COMMON}.CommonKVManager.build_receiver_metadata_message(bootstrap_room, required_dst_info_num, "
        "kv_indices, aux_index, state_indices, decode_prefix_len, is_dummy)"
    ),
    *_members(
        f"{_COMMON}.CommonKVManager",
        "kv_status_msg_tag kv_status_msg_carries_reason parse_kv_status_message handle_abort_ack_message "
        "_handle_bootstrap_message _start_heartbeat_checker_thread _send_multipart_locked "
        "build_receiver_registration_message record_failure check_status",
    ),
    *_instance(
        f"{_COMMON}.CommonKVManager",
        "kv_args local_ip rank_port attn_tp_size attn_tp_rank server_socket request_status req_to_decode_prefix_len "
        "deferred_bootstrap",
    ),
    # `CommonKVSender.send` calls the manager's `add_transfer_request`, which the
    # common manager leaves to each backend: Mooncake's states the contract.
    (
        "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.add_transfer_request(bootstrap_room, "
        "kv_indices, index_slice, is_last_chunk, aux_index, state_indices, num_kv_tokens)"
    ),
    f"{_COMMON}.CommonKVSender.__init__(mgr, bootstrap_addr, bootstrap_room)",
    *_members(f"{_COMMON}.CommonKVSender", "send poll abort clear failure_exception get_transfer_metric"),
    *_instance(f"{_COMMON}.CommonKVSender", "kv_mgr bootstrap_room conclude_state"),
    f"{_COMMON}.CommonKVReceiver.__init__(mgr, bootstrap_addr, bootstrap_room)",
    f"{_COMMON}.CommonKVReceiver.send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len)",
    # `lynx_patches.pd.registry.send_kv_metadata` passes the token count through these keyword arguments.
    f"{_DECODE}.DecodePreallocQueue._send_kv_metadata(decode_req, kv_indices, page_size, metadata_kwargs)",
    *_members(f"{_COMMON}.CommonKVReceiver", "poll clear ensure_abort_notified failure_exception _owns_bootstrap_room"),
    *_instance(f"{_COMMON}.CommonKVReceiver", "kv_mgr bootstrap_room bootstrap_addr bootstrap_infos conclude_state"),
    *_members(f"{_COMMON}.AbortNotification", "to_zmq from_zmq"),
    *_instance(f"{_COMMON}.AbortNotification", "room decode_ip decode_port"),
    *_members(_COMMON, "CommonKVBootstrapServer ABORT_TAG KVTransferError"),
    "sglang.srt.disaggregation.base.conn.KVPoll",
    *_instance("sglang.srt.disaggregation.base.conn.KVTransferMetric", "transfer_total_bytes"),
    "sglang.srt.disaggregation.base.KVArgs",
    *_instance("sglang.srt.disaggregation.base.conn.KVArgs", "page_size engine_rank aux_data_ptrs aux_item_lens"),
    "sglang.srt.disaggregation.utils.TransferBackend",
    "sglang.srt.disaggregation.utils.DisaggregationMode.DECODE",
    *_members("sglang.srt.disaggregation.utils.KVClassType", "KVARGS MANAGER SENDER RECEIVER BOOTSTRAP_SERVER"),
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender().supports_host_tensor_indices",
    *_instance(f"{_PREFILL}.PrefillBootstrapQueue", "token_to_kv_pool scheduler"),
    *_instance(f"{_DECODE}.DecodePreallocQueue", "token_to_kv_pool scheduler"),
    f"{_DECODE}.DecodeTransferQueue().scheduler",
    *_instance(f"{_DECODE}.DecodeRequest", "req kv_receiver"),
    "sglang.srt.server_args.add_disagg_transfer_backend_choices",
    "sglang.srt.utils.network.NetworkAddress.to_tcp",
    # The scheduler and its components, requests, batches and pools.
    f"{SCHEDULER_INIT}(server_args)",
    *_instance(
        _SCHEDULER,
        "server_args model_config tp_worker req_to_token_pool token_to_kv_pool_allocator tree_cache "
        "spec_algorithm page_size max_total_num_tokens waiting_queue output_streamer metrics_reporter idle_sleeper "
        "attn_tp_cpu_group",
    ),
    # The decode ranks' one all-reduce per residual decision (lynx_patches.speculate.agree).
    "sglang.srt.disaggregation.utils.all_reduce_flags(flags, group, op)",
    "sglang.srt.configs.model_config.ModelConfig().vocab_size",
    # Which KV heads a TP rank holds (lynx_patches.pd.pool.head_shard); SGLang's CPU head padding
    # also records `original_total_num_kv_heads` on the HF config, read with a fallback.
    "sglang.srt.configs.model_config.ModelConfig().hf_config",
    "sglang.srt.configs.model_config.ModelConfig.get_total_num_kv_heads",
    f"{_COMPONENTS}.metrics_reporter.SchedulerMetricsReporter().enable_metrics",
    f"{_COMPONENTS}.output_streamer.SchedulerOutputStreamer.stream_output(reqs, return_logprob)",
    f"{STREAM_ACCEPT}(req)",
    f"{_COMPONENTS}.internal_state.SchedulerInternalStateController().scheduler",
    "sglang.srt.managers.io_struct.GetInternalStateReqOutput().internal_state",
    *_instance(
        f"{_COMPONENTS}.batch_result_processor.SchedulerBatchResultProcessor",
        "token_to_kv_pool_allocator req_to_token_pool",
    ),
    f"{_COMPONENTS}.idle_sleeper.IdleSleeper().poller",
    f"{_COMPONENTS}.idle_sleeper.RustServerIdleSleeper",
    "zmq.Poller().sockets",
    *_instance(
        f"{_BATCH}.Req",
        "rid origin_input_ids output_ids sampling_params bootstrap_room kv logprob return_logprob grammar "
        "to_finish finished_reason finished send_token_offset skip_radix_cache_insert customized_info "
        "inflight_middle_chunks custom_logit_processor return_hidden_states return_sampling_mask "
        "require_reasoning lora_id beam_group prefix_len extend_end disagg_decode_prefix_len disagg_kv_sender "
        "full_untruncated_fill_ids",
    ),
    f"{_BATCH}.Req._compute_max_prefix_len(input_len)",
    *_instance(f"{_BATCH}.ReqKvInfo", "req_pool_idx kv_allocated_len kv_committed_len"),
    *_instance(f"{_BATCH}.ReqLogprob", " ".join(("top_logprobs_num token_ids_logprob", *LOGPROB_LISTS))),
    (
        f"{_BATCH}.ScheduleBatch.init_new(reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, "
        "model_config, enable_overlap, spec_algorithm)"
    ),
    f"{_BATCH}.ScheduleBatch.filter_batch(keep_indices)",
    *_instance(
        f"{_BATCH}.ScheduleBatch",
        "reqs sampling_info forward_mode return_logprob input_ids req_pool_indices req_pool_indices_cpu "
        "seq_lens seq_lens_cpu orig_seq_lens seq_lens_sum out_cache_loc prefix_lens extend_lens "
        "extend_num_tokens extend_logprob_start_lens multimodal_inputs",
    ),
    *_instance(f"{_BATCH}.NextBatchPlan", "batch_to_run running_batch"),
    f"{_BATCH}.FINISH_ABORT",
    *_instance(_PARAMS, "max_new_tokens temperature top_k top_p min_p sampling_seed n"),
    *_instance("sglang.srt.managers.io_struct.TokenizedGenerateReqInput", "sampling_params bootstrap_room"),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager().server_args",
    *_instance(f"{_POOL}.ReqToTokenPool", "req_to_token device available_size"),
    *_members(_ALLOCATOR, "free available_size get_kvcache"),
    *_members(_POOL, "KVWriteLoc MHATokenToKVPool"),
    f"{_POOL}.MHATokenToKVPool.set_kv_buffer(layer, loc_info, cache_k, cache_v)",
    f"{_POOL}.MHATokenToKVPool.get_key_buffer(layer_id)",
    f"{_POOL}.MHATokenToKVPool.get_value_buffer(layer_id)",
    *_instance(f"{_POOL}.MHATokenToKVPool", "k_buffer v_buffer page_size dtype store_dtype head_num start_layer"),
    f"{_SCHEDULER}.run_batch(batch)",
    f"{_FORWARD}.ForwardMode.is_extend",
    "sglang.srt.mem_cache.common.release_kv_cache(req, tree_cache, checkpoint)",
    "sglang.srt.mem_cache.common.checkpoint_kv_cache(req, tree_cache)",
    # The verify pass: a forward, its logits, SGLang's sampling state and sampler.
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation(batch, forward_batch, is_verify)",
    "sglang.srt.managers.tp_worker.TpModelWorker().model_runner",
    "sglang.srt.managers.utils.GenerationBatchResult().logits_output",
    *_instance("sglang.srt.model_executor.model_runner.ModelRunner", "sampler model"),
    f"{_FORWARD}.ForwardBatch.init_new(batch, model_runner, capture_hidden_mode, return_hidden_states_before_norm)",
    *_instance(
        f"{_FORWARD}.ForwardBatch",
        "out_cache_loc req_pool_indices seq_lens extend_seq_lens encoder_lens extend_prefix_lens_cpu",
    ),
    f"{_FORWARD}.CaptureHiddenMode.FULL",
    f"{_FORWARD}.ForwardMode.EXTEND",
    f"{_LOGITS}.LogitsMetadata.from_forward_batch",
    f"{_LOGITS}.LogitsProcessor._get_logits(hidden_states, lm_head, logits_metadata, use_logits_buffer)",
    *_instance(
        f"{_LOGITS}.LogitsProcessorOutput",
        "next_token_logits next_token_logprobs next_token_top_logprobs_val next_token_top_logprobs_idx "
        "next_token_token_ids_logprobs_val next_token_token_ids_logprobs_idx hidden_states",
    ),
    (
        f"{SAMPLER_FORWARD}(logits_output, sampling_info, return_logprob, top_logprobs_nums, "
        "token_ids_logprobs, positions)"
    ),
    f"{_SAMPLING_INFO}.from_schedule_batch(batch, vocab_size)",
    f"{_SAMPLING_INFO}.apply_logits_bias(logits)",
    *_instance(_SAMPLING_INFO, "penalizer_orchestrator grammar_mask"),
    f"{_PENALTIES}.BatchedPenalizerOrchestrator.__init__(vocab_size, batch, penalizers)",
    *_members(f"{_PENALTIES}.BatchedPenalizerOrchestrator", "cumulate_output_tokens merge"),
    *_instance(f"{_PENALTIES}.BatchedPenalizerOrchestrator", "is_required batch"),
    *_members(
        _PENALTIES,
        "BatchedFrequencyPenalizer BatchedMinNewTokensPenalizer BatchedPresencePenalizer BatchedRepetitionPenalizer",
    ),
    f"{_GRAMMAR}.allocate_vocab_mask(vocab_size, batch_size, device)",
    f"{_GRAMMAR}.fill_vocab_mask(vocab_mask, idx)",
    f"{_GRAMMAR}.move_vocab_mask(vocab_mask, device)",
    f"{_GRAMMAR}.accept_token(token)",
    f"{_GRAMMAR}.rollback(k)",
    f"{_GRAMMAR}.is_terminated",
    f"{_GRAMMAR}().finished",
    "sglang.srt.constrained.base_grammar_backend.GrammarMask",
    # Attention of a verify pass (lynx_patches.speculate.attention).
    f"{TORCH_NATIVE_EXTEND}(q, k, v, layer, forward_batch, save_kv_cache)",
    *_instance(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend",
        "token_to_kv_pool req_to_token_pool swa_out_cache_loc",
    ),
    *_instance(
        "sglang.srt.layers.radix_attention.RadixAttention",
        "layer_id tp_q_head_num tp_k_head_num qk_head_dim v_head_dim scaling is_cross_attention sliding_window_size",
    ),
    # Server arguments Lynx reads or defaults (cli, platform).
    *_instance(
        "sglang.srt.server_args.ServerArgs",
        "host disaggregation_mode disaggregation_transfer_backend disaggregation_decode_retraction_backup "
        "disable_radix_cache disable_overlap_schedule disable_cuda_graph attention_backend sampling_backend "
        "page_size sleep_on_idle tp_size pp_size dp_size base_gpu_id gpu_id_step",
    ),
    # What the `lynx_cpu` platform overrides, and the module flags and helpers it relies on.
    *_members(
        "sglang.srt.platforms.interface.SRTPlatform",
        "get_device is_pin_memory_available get_default_attention_backend get_dispatch_key_name "
        "apply_server_args_defaults init_backend capabilities",
    ),
    "sglang.srt.layers.linear._is_cpu",
    "sglang.srt.layers.parameter._is_cpu",
    "sglang.srt.utils.common.get_cpu_ids_by_node",
    "sglang.srt.platforms.current_platform",
    "sglang.srt.managers.utils.is_health_check_generate_req",
    "sglang.srt.runtime_context.get_server_args",
)
