"""``sluice run``: horizontal federated learning with compressed traffic both ways."""

from __future__ import annotations

import argparse

from rich.console import Console

from sluice.cli.common import add_config_arguments
from sluice.runtimes.flower.rounds import DEFAULT_EMPTY_ROUNDS
from sluice.runtimes.training import train_hfl


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train across simulated clients (horizontal FL)",
        description="Horizontal FL with unbiased sampled uploads (2 % of the coordinates as signs), server top-k "
        "with error feedback and a per-client sparse downlink, on the job's task ([task]: a built-in or your "
        "own factory). With no config it runs the built-in default (digits, 20 clients, Dirichlet 0.3, "
        "q=0.25, 150 rounds). Dense FedAvg baseline: "
        "--set compression.up=dense --set compression.down=dense",
    )
    add_config_arguments(p, out_default="runs/run-<timestamp>", example="train.rounds=50")
    f = p.add_argument_group("Flower runtime (pip install 'sluice[flower]')")
    f.add_argument("--runtime", choices=("sim", "flower", "flower-sim"), default="sim",
                   help="sim: in-process simulation (default); flower: Flower's deployment engine, a SuperLink "
                   "and one SuperNode per client on 127.0.0.1 (TLS), or the SuperLink given by --superlink; "
                   "flower-sim: Flower's Simulation Engine (Ray; pip install 'sluice[flower]'), a SuperLink and "
                   "one virtual SuperNode per client, on a local Ray instance or the cluster RAY_ADDRESS names")
    f.add_argument("--ray-cpus", type=int, metavar="N",
                   help="flower-sim: CPUs of the local Ray instance (default: every CPU)")
    f.add_argument("--nodes", type=int, help="local SuperNodes to start (default: one per client)")
    f.add_argument("--superlink", metavar="HOST:PORT", help="submit to this running SuperLink instead")
    f.add_argument("--root-certificates", metavar="CA.pem", help="CA that signed the SuperLink's certificate")
    f.add_argument("--insecure", action="store_true", help="no TLS (only with a SuperLink started --insecure)")
    f.add_argument("--round-timeout", type=float, default=60.0, metavar="S",
                   help="a node that has not answered after S seconds counts as dropped in that round")
    f.add_argument("--node-wait", type=float, default=120.0, metavar="S",
                   help="the first round waits up to S seconds for a node per client to answer (many virtual nodes "
                   "on few CPUs, --runtime flower-sim, answer in turn and need longer)")
    f.add_argument("--link-timeout", type=float, default=30.0, metavar="S",
                   help="a SuperLink that does not answer for S seconds ends the run with ENGINE_FAILURE")
    f.add_argument("--empty-rounds", type=int, default=DEFAULT_EMPTY_ROUNDS, metavar="N",
                   help="a round no node answers is not an iteration and is sent again; N such rounds in a row end "
                   "the run with ENGINE_FAILURE, naming each node's last error (the first round waits longer by "
                   "the ClientApp start-up the nodes measure)")
    f.add_argument("--node-arg", dest="node_args", action="append", default=[], metavar="[C:]NAME=VALUE",
                   help="a task argument of the local SuperNode of terminal C alone, or of every one without C:, "
                   "where {c} in VALUE is the node's terminal, e.g. --node-arg 'data_dir=/data/site-{c}' "
                   "(repeatable; the node's task.NAME node setting)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from sluice.runtimes.jobs import load_job

    flower_only = [name for name, value in (("--nodes", args.nodes), ("--superlink", args.superlink),
                                            ("--root-certificates", args.root_certificates),
                                            ("--insecure", args.insecure), ("--node-arg", args.node_args),
                                            ("--empty-rounds", args.empty_rounds != DEFAULT_EMPTY_ROUNDS),
                                            ("--node-wait", args.node_wait != 120.0))
                   if value]
    if flower_only and args.runtime == "sim" or args.ray_cpus is not None and args.runtime != "flower-sim":
        from sluice.errors import ConfigError

        if args.ray_cpus is not None and args.runtime != "flower-sim":
            raise ConfigError("--ray-cpus only applies with --runtime flower-sim")
        raise ConfigError(f"{', '.join(flower_only)} only apply with --runtime flower or flower-sim")
    job = load_job("hfl", args.config, args.overrides)
    if args.runtime in ("flower", "flower-sim"):
        from sluice.runtimes.flower.runner import FlowerOptions, run_on_flower

        opts = FlowerOptions(nodes=args.nodes, insecure=args.insecure, superlink=args.superlink,
                             root_certificates=args.root_certificates, round_timeout_s=args.round_timeout,
                             link_timeout_s=args.link_timeout, node_wait_s=args.node_wait,
                             empty_rounds=args.empty_rounds,
                             node_args=args.node_args, simulation=args.runtime == "flower-sim",
                             ray_cpus=args.ray_cpus)
        return run_on_flower(job, args.out, opts, console=Console())
    return train_hfl(job, args.out, Console())
