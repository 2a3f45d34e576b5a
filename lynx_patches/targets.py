"""Every SGLang 0.5.23 attribute Lynx hooks, in one place (see docs/ARCHITECTURE.md)."""

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
KV_MANAGER_UPDATE_STATUS = "sglang.srt.disaggregation.common.conn.CommonKVManager.update_status"
TOKENIZER_SEND_ONE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request"
STREAM_ACCEPT = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
REQ_UPDATE_FINISH_STATE = "sglang.srt.managers.schedule_batch.Req.update_finish_state"
SAMPLER_FORWARD = "sglang.srt.layers.sampler.Sampler.forward"
MOONCAKE_SENDER_INIT = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"

# SGLang names Lynx calls, reads or overrides without hooking them. The start-up
# self-check resolves each one, so an SGLang that renamed one refuses `--lynx`
# at start-up instead of failing requests later.
_COMMON = "sglang.srt.disaggregation.common.conn"
USED = (
    f"{_COMMON}.CommonKVManager._encode_kv_status_message",
    f"{_COMMON}.CommonKVManager.parse_kv_status_message",
    f"{_COMMON}.CommonKVManager.send_kv_status_message",
    f"{_COMMON}.CommonKVManager.handle_abort_ack_message",
    f"{_COMMON}.CommonKVManager._handle_node_failure",
    f"{_COMMON}.CommonKVManager._handle_bootstrap_message",
    f"{_COMMON}.CommonKVManager._start_heartbeat_checker_thread",
    f"{_COMMON}.CommonKVManager._send_multipart_locked",
    f"{_COMMON}.CommonKVManager.build_receiver_registration_message",
    f"{_COMMON}.CommonKVManager.build_receiver_metadata_message",
    f"{_COMMON}.CommonKVManager.record_failure",
    f"{_COMMON}.CommonKVManager.update_status",
    f"{_COMMON}.CommonKVManager.check_status",
    f"{_COMMON}.CommonKVReceiver.ensure_abort_notified",
    f"{_COMMON}.CommonKVReceiver.failure_exception",
    f"{_COMMON}.CommonKVSender.failure_exception",
    f"{_COMMON}.AbortNotification.to_zmq",
    f"{_COMMON}.AbortNotification.from_zmq",
    f"{_COMMON}.ABORT_TAG",
    f"{_COMMON}.KVTransferError",
    "sglang.srt.disaggregation.base.conn.KVPoll",
    "sglang.srt.disaggregation.utils.TransferBackend",
    "sglang.srt.server_args.add_disagg_transfer_backend_choices",
    "sglang.srt.utils.network.NetworkAddress.to_tcp",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.init_new",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.filter_batch",
    "sglang.srt.managers.schedule_batch.FINISH_ABORT",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
    "sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode",
    "sglang.srt.model_executor.forward_batch_info.ForwardMode",
    "sglang.srt.layers.logits_processor.LogitsMetadata.from_forward_batch",
    "sglang.srt.layers.logits_processor.LogitsProcessor._get_logits",
    "sglang.srt.layers.logits_processor.LogitsProcessorOutput",
    "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch",
    "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.apply_logits_bias",
    "sglang.srt.sampling.penaltylib.BatchedPenalizerOrchestrator.cumulate_output_tokens",
    "sglang.srt.sampling.penaltylib.BatchedPenalizerOrchestrator.merge",
    "sglang.srt.sampling.penaltylib.BatchedFrequencyPenalizer",
    "sglang.srt.sampling.penaltylib.BatchedMinNewTokensPenalizer",
    "sglang.srt.sampling.penaltylib.BatchedPresencePenalizer",
    "sglang.srt.sampling.penaltylib.BatchedRepetitionPenalizer",
    "sglang.srt.constrained.base_grammar_backend.BaseGrammarObject.rollback",
    "sglang.srt.constrained.base_grammar_backend.GrammarMask",
    "sglang.srt.mem_cache.memory_pool.KVWriteLoc",
    "sglang.srt.managers.scheduler_components.idle_sleeper.IdleSleeper",
    "sglang.srt.mem_cache.common.release_kv_cache",
    "sglang.srt.mem_cache.common.checkpoint_kv_cache",
    "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool",
    "sglang.srt.managers.utils.is_health_check_generate_req",
    "sglang.srt.runtime_context.get_server_args",
)
