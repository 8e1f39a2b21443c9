"""Check a phase's params: names, init methods and values, one owner per name, sharing by shape.

``params`` (name -> (logical shape, owner layer)) gathers the owners over the job's phases; a
phase's ``share_from`` is checked once all its owners are known.
"""
from __future__ import annotations

from singa_mpi.config.load import JobConfig
from singa_mpi.errors import ConfigError
from singa_mpi.graph import Node
from singa_mpi.layers.base import Layer
from singa_mpi.net import describe
from singa_mpi.params import init_method, init_value_problem


def check_params(cfg: JobConfig, node: Node, layer: Layer, params: dict) -> None:
    names = set()
    for k, spec in enumerate(layer.param_specs):
        conf = spec.conf
        field = f"param[{k}]"
        if not conf.name:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k)}: {describe(cfg, node)}: "
                              f"{field}.name = missing: expected a param name unique in the job")
        if conf.name in names:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'name')}: {describe(cfg, node)}: "
                              f"{field}.name = {conf.name!r}: expected a name not used twice in one layer")
        names.add(conf.name)
        for scale, what in (("lr_scale", "learning rate for this param; 0 freezes it"),
                            ("wd_scale", "weight decay for this param; 0 turns it off")):
            if getattr(conf, scale) < 0:  # a sign slip: the updater refuses a negative rate or decay too
                raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, scale)}: {describe(cfg, node)}: "
                                  f"{field}.{scale} = {getattr(conf, scale):g}: expected a value >= 0 (it "
                                  f"scales the updater's {what})")
        if conf.share_from:
            continue
        if not conf.HasField("init") and not cfg.proto.checkpoint_path:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k)}: {describe(cfg, node)}: "
                              f"{field}.init = missing: expected init {{ type: ... }}, or checkpoint_path in the "
                              f"job to load {conf.name!r} from")
        try:
            if conf.HasField("init"):  # without one, the values come from checkpoint_path
                init_method(conf)
        except ConfigError as err:  # "init.type = kUserInit: expected one of ..."
            written = "user_type" if conf.init.HasField("user_type") else "type"
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'init', written)}: "
                              f"{describe(cfg, node)}: {field}.{err}") from None
        problem = init_value_problem(conf.init) if conf.HasField("init") else None
        if problem is not None:
            name, expected = problem
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'init', name)}: {describe(cfg, node)}: "
                              f"{field}.init.{name} = {getattr(conf.init, name):g}: expected {expected}")
        known = params.get(conf.name)
        if known is not None and known[1] != node.name:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'name')}: {describe(cfg, node)}: "
                              f"{field}.name = {conf.name!r}: expected a name not used by another layer's "
                              f"param (layer '{known[1]}' declares it; use share_from to share it)")
        if known is not None and known[0] != spec.logical_shape:  # the same layer, in another phase's net
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'name')}: {describe(cfg, node)}: "
                              f"{field}.name = {conf.name!r}: expected one shape in every phase: "
                              f"{spec.logical_shape} in the {layer.ctx.phase} net, {known[0]} in an earlier "
                              f"phase's (the layers below read inputs of other shapes there: compare the "
                              f"phases' input layers, such as store_conf.shape)")
        params[conf.name] = (spec.logical_shape, node.name)


def check_shared_params(cfg: JobConfig, node: Node, layer: Layer, params: dict) -> None:
    for k, spec in enumerate(layer.param_specs):
        owner = spec.conf.share_from
        if not owner:
            continue
        where = cfg.layer_where(node.index, "param", k, "share_from")
        if owner not in params:
            raise ConfigError(f"{where}: {describe(cfg, node)}: param[{k}].share_from = {owner!r}: "
                              f"expected the name of a param declared by another layer "
                              f"(known: {', '.join(sorted(params)) or 'none'})")
        if params[owner][0] != spec.logical_shape:
            raise ConfigError(f"{where}: {describe(cfg, node)}: param[{k}].share_from = {owner!r}: "
                              f"expected a param of shape {spec.logical_shape}, {owner!r} has {params[owner][0]}")
