"""Hydra plugin hook for parity's config validation.

DVC composes conf/ into params.yaml on every `dvc exp run` and asks Hydra to discover plugins under
the repo root (`hydra.plugins_path`, default ""). Hydra imports every module in the `hydra_plugins`
namespace package, so importing this one:

1. registers the `${parity_validate:}` resolver used by conf/config.yaml. It runs
   parity.config.params.validate on the whole composed config and parity.suites.spec.check_selected on the
   selected suites (kept apart, so no model stage depends on the suite format), so an unknown key or
   bad value fails the compose, before DVC writes params.yaml or runs any stage;
2. registers `${parity_coverage_dep:}`: the report stage's dependency for the op-coverage matrix
   (artifacts/suites/coverage when suites are selected, else conf/suites, a path that always
   exists: DVC rejects a missing dependency, and the coverage folder exists only with suites);
3. makes Hydra's error for an unknown option of a multi-select group (`-S 'models=[zzz]'`) list the
   valid options. Hydra 1.3 lists them only for single-select groups ("Could not load 'models/zzz'"
   otherwise). This wraps hydra._internal.defaults_list.config_not_found_error (pinned
   hydra-core==1.3.8); if that private function moves, the wrap is skipped and Hydra's own message
   stands;
4. makes a YAML syntax error in a conf file one line, `parity: config error: FILE:LINE:COL: problem`
   (Hydra lets the YAML parser's multi-line error through; DVC prints it after "unexpected error"),
   and records the top-level keys of every conf/<group>/<option>.yaml Hydra loads, so `validate`
   can refuse a file keyed with another name than its own (conf/models/foo.yaml holding `bar:`:
   Hydra merges it as models.bar, and the option name no longer says which file it came from).
   This wraps FileConfigSource.load_config (hydra-core 1.3.8), like 3.

Errors raised while resolving `${parity_validate:}` are ParityConfigError: OmegaConf passes an
initialised exception of its own through unwrapped, so the message stays one line (no
"ValueError raised while resolving interpolation", no "full_key:" lines).
"""

import os
import re
from pathlib import Path

from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

GROUPS = ("models", "dtypes", "providers", "suites")
_LOADED: dict = {}  # "group/option" -> (file, [top-level keys]) of each conf file Hydra loaded
_CONF_DIRS: list = []  # the file:// directories of the search path (conf/)


class ParityConfigError(InterpolationResolutionError):
    """A one-line config error that OmegaConf re-raises as it is."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self._initialized = True


class ParityConfPlugin(SearchPathPlugin):
    """Sees each Hydra initialisation first: forgets the previous composition's records and notes
    the conf directories (for the options a group offers). The search path is left as is."""

    def manipulate_search_path(self, search_path) -> None:  # noqa: D102
        _LOADED.clear()
        _CONF_DIRS[:] = [_file_path(e.path) for e in search_path.get_path()
                         if e.provider == "main" and "://" not in _file_path(e.path)]


def _file_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _rel(path: str) -> str:
    """`path` relative to the working directory (the repo root under DVC) when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _available(group: str) -> str:
    opts = sorted({f.stem for d in _CONF_DIRS for f in Path(d, group).glob("*.yaml")})
    return f" Available options in '{group}': {', '.join(opts)}" if opts else ""


def _path_option(source: str) -> str | None:
    """The one-line error for an option given as a path (`-S 'models=[../providers/x]'`), else None: Hydra
    resolves it to another group's file (issue 36 item 8: "bad option name ''", or another group's options)."""
    group = source.split("/", 1)[0]
    if group not in GROUPS or "/" not in source[len(group) + 1:] and ".." not in source:
        return None
    option = source[len(group) + 1:]
    return (f"parity: config error: {group}: option '{option}' is a path; an option is the name of a file in "
            f"conf/{group}/ (without .yaml).{_available(group)}")


def _check_loaded(p: dict) -> None:
    """Every option of a group came from the conf file of the same name, keyed by that name."""
    from parity.config.params import ConfigError

    for source in sorted(_LOADED):
        if _path_option(source):
            raise ConfigError(_path_option(source).removeprefix("parity: config error: "))
    for source, (file, keys) in sorted(_LOADED.items()):
        group, _, option = source.rpartition("/")
        if group not in GROUPS:
            continue
        for k in keys:
            if k != option and k in (p.get(group) or {}):
                raise ConfigError(f"{_rel(file)}: the option '{option}' must hold one mapping keyed by its own "
                                  f"name '{option}', found '{k}' (rename the key or the file)")


ENV_READ = re.compile(r"\$\{\s*oc\.env\s*:")


def _env_reads(node, key: str = "") -> list[str]:
    """The dotted keys whose value is an `${oc.env:...}` interpolation (at any depth)."""
    if isinstance(node, dict):
        return [k for name, v in node.items() for k in _env_reads(v, f"{key}.{name}" if key else str(name))]
    if isinstance(node, list):
        return [k for i, v in enumerate(node) for k in _env_reads(v, f"{key}[{i}]")]
    return [key] if isinstance(node, str) and ENV_READ.search(node) else []


def _validate(*, _root_) -> str:
    from parity.config import params as config
    from parity.suites import spec

    p = OmegaConf.to_container(_root_, resolve=False)
    p.pop("validated", None)
    try:
        env = _env_reads(p)
        if env:  # DVC writes the resolved value into params.yaml, which is committed: a secret would leak
            raise config.ConfigError(f"{env[0]}: reads the environment (${{oc.env:...}}); DVC writes the resolved "
                                     "value into params.yaml, which git records: give the value itself, or keep "
                                     "secrets (remote credentials) in `dvc remote modify --local`")
        for g in ("models", "dtypes", "providers"):
            if not p.get(g):
                raise config.ConfigError(f"{g}: no option selected ({g}=[]); select at least one, e.g. "
                                         f"-S '{g}=[...]'.{_available(g)}")
        _check_loaded(p)
        config.validate(p)
        spec.check_selected(p)  # the suites apart: no model stage depends on the suite format
    except (config.ConfigError, spec.SuiteError) as e:
        raise ParityConfigError(f"parity: config error: {e}") from None
    return config.summary_line(p)


def _coverage_dep(*, _root_) -> str:
    """The report's coverage input: the suites' coverage folder when suites are selected, else
    conf/suites (DVC needs every dependency to exist; that folder always does)."""
    from parity.core import paths

    return paths.SUITES_COVERAGE if _root_.get("suites") else "conf/suites"


def _plan_dep(*, _root_) -> str:
    """The report's plan input: the plan stages' folder with analysis.plan, else conf/dtypes (a
    path that always exists: DVC rejects a missing dependency)."""
    from parity.core import paths

    return paths.PLAN if (_root_.get("analysis") or {}).get("plan") is True else "conf/dtypes"


def _suite_tolerances(*, _root_) -> dict:
    """params.yaml's suite_tolerances: each suite's tolerance rules per selected dtype (the ones that
    can apply there), what a suite diff stage depends on (parity.suites.features.tolerances_by_dtype)."""
    from parity.suites import features

    suites = _root_.get("suites")
    suites = OmegaConf.to_container(suites, resolve=False) if OmegaConf.is_config(suites) else (suites or {})
    return OmegaConf.create(features.tolerances_by_dtype(suites, list(_root_.get("dtypes") or {})))


if not OmegaConf.has_resolver("parity_suite_tolerances"):
    OmegaConf.register_new_resolver("parity_suite_tolerances", _suite_tolerances)


def _reduce_dep(*, _root_) -> str:
    """The report's reduce input: the reduce stages' folder with analysis.reduce, else conf/dtypes."""
    from parity.core import paths

    return paths.REDUCE if (_root_.get("analysis") or {}).get("reduce") is True else "conf/dtypes"


if not OmegaConf.has_resolver("parity_reduce_dep"):
    OmegaConf.register_new_resolver("parity_reduce_dep", _reduce_dep)


def _fuzz_dep(*, _root_) -> str:
    """The report's fuzz input: artifacts/fuzz when fuzz.suites names one, else conf/suites."""
    from parity.core import paths

    return paths.FUZZ if (_root_.get("fuzz") or {}).get("suites") else "conf/suites"


def _train_dep(*, _root_) -> str:
    """The report's training-step input: artifacts/train_step with train_step.models, else conf/models."""
    from parity.core import paths

    return paths.TRAIN_STEP if (_root_.get("train_step") or {}).get("models") else "conf/models"


def _generate_dep(*, _root_) -> str:
    """The report's generation-drift input: artifacts/generate with generate.models, else conf/models."""
    from parity.core import paths

    return paths.GENERATE if (_root_.get("generate") or {}).get("models") else "conf/models"


for _name, _fn in (("parity_fuzz_dep", _fuzz_dep), ("parity_train_dep", _train_dep),
                   ("parity_generate_dep", _generate_dep)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _fn)
if not OmegaConf.has_resolver("parity_plan_dep"):
    OmegaConf.register_new_resolver("parity_plan_dep", _plan_dep)
if not OmegaConf.has_resolver("parity_validate"):
    OmegaConf.register_new_resolver("parity_validate", _validate)
if not OmegaConf.has_resolver("parity_coverage_dep"):
    OmegaConf.register_new_resolver("parity_coverage_dep", _coverage_dep)


def _wrap_missing_option_error() -> None:
    try:
        from hydra._internal import defaults_list as dl
        from hydra.core.object_type import ObjectType
        from hydra.errors import MissingConfigException
    except ImportError:
        return
    orig = getattr(dl, "config_not_found_error", None)
    if orig is None or getattr(orig, "_parity_wrapped", False):
        return

    def config_not_found_error(repo, tree):
        try:
            orig(repo=repo, tree=tree)
        except MissingConfigException as e:
            path = e.missing_cfg_file or ""
            group, _, option = path.rpartition("/")
            if not group or str(e).startswith("parity:"):  # Hydra's own text ends with its search path
                raise
            if _path_option(path):
                raise MissingConfigException(_path_option(path), missing_cfg_file=path) from None
            options = repo.get_group_options(group, ObjectType.CONFIG)
            msg = (f"parity: config error: unknown {group} option '{option}' (no conf/{path}.yaml). "
                   f"Available options in '{group}': {', '.join(options)}")
            raise MissingConfigException(msg, missing_cfg_file=path, options=options) from None

    config_not_found_error._parity_wrapped = True
    dl.config_not_found_error = config_not_found_error


def _yaml_error(e, file: str) -> str:
    """`FILE:LINE:COL: problem (context)` from a YAML parser error, on one line."""
    mark = getattr(e, "problem_mark", None)
    where = f"{_rel(file)}:{mark.line + 1}:{mark.column + 1}" if mark else _rel(file)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    ctx = getattr(e, "context", None)
    cm = getattr(e, "context_mark", None)
    extra = f" ({ctx}{f' at line {cm.line + 1}, column {cm.column + 1}' if cm else ''})" if ctx else ""
    return f"parity: config error: {where}: YAML syntax error: {what}{extra}"


class ConfFileError(ValueError):
    """A conf file Hydra cannot read (one line: file:line:col)."""


def _wrap_load_config() -> None:
    try:
        import yaml
        from hydra._internal.core_plugins.file_config_source import FileConfigSource
    except ImportError:
        return
    orig = getattr(FileConfigSource, "load_config", None)
    if orig is None or getattr(orig, "_parity_wrapped", False):
        return

    def load_config(self, config_path: str):
        file = os.path.join(_file_path(self.path), self._normalize_file_name(config_path))
        try:
            result = orig(self, config_path)
        except yaml.YAMLError as e:
            raise ConfFileError(_yaml_error(e, file)) from None
        cfg = result.config
        keys = [str(k) for k in cfg.keys()] if OmegaConf.is_dict(cfg) else []
        _LOADED[config_path[:-5] if config_path.endswith(".yaml") else config_path] = (file, keys)
        return result

    load_config._parity_wrapped = True
    FileConfigSource.load_config = load_config


_wrap_missing_option_error()
_wrap_load_config()
