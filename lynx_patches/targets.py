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
STREAM_ACCEPT = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
REQ_UPDATE_FINISH_STATE = "sglang.srt.managers.schedule_batch.Req.update_finish_state"
SAMPLER_FORWARD = "sglang.srt.layers.sampler.Sampler.forward"
