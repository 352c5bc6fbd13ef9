"""Run in the vLLM or SGLang oracle environment: parse the server command line of ``scripts/gpu_probe.py`` (JSON argv on
stdin) with the engine's own argument parser, and print what the engine reads from it (one JSON object).

``vllm``: the parser ``vllm serve`` builds (``make_arg_parser``, as ``ServeSubcommand.subparser_init`` calls it; the
subcommand module itself imports uvicorn, which the oracle environment lacks) and ``validate_parsed_serve_args``. ``sglang``: ``ServerArgs.add_cli_args``' parser."""

from __future__ import annotations

import argparse
import json
import sys


def vllm(argv: list[str]) -> dict[str, object]:
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[argv.index("serve") + 1 :])
    validate_parsed_serve_args(args)
    return {
        "model": args.model_tag,
        "enable_lora": args.enable_lora,
        "max_lora_rank": args.max_lora_rank,
        "loras": {m.name: m.path for m in args.lora_modules},
        "port": args.port,
    }


def sglang(argv: list[str]) -> dict[str, object]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv[argv.index("sglang.launch_server") + 1 :])
    paths = args.lora_paths
    loras = dict(p.split("=", 1) for p in paths) if isinstance(paths, list) else paths
    return {
        "model": args.model_path,
        "enable_lora": args.enable_lora,
        "max_lora_rank": args.max_lora_rank,
        "loras": loras,
        "port": args.port,
    }


if __name__ == "__main__":
    command = json.loads(sys.stdin.read())
    print(json.dumps(vllm(command) if sys.argv[1] == "vllm" else sglang(command)))
