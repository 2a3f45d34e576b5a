"""Every SGLang 0.5.23 attribute Lynx hooks, in one place (see docs/ARCHITECTURE.md)."""

SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
SERVER_ARGS_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"
