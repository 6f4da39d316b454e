"""Hydra plugin hook for parity's config validation.

DVC composes conf/ into params.yaml on every `dvc exp run` and asks Hydra to discover plugins under
the repo root (`hydra.plugins_path`, default ""). Hydra imports every module in the `hydra_plugins`
namespace package, so importing this one:

1. registers the `${parity_validate:}` resolver used by conf/config.yaml. It runs
   parity.config.validate on the whole composed config, so an unknown key or bad value fails the
   compose, before DVC writes params.yaml or runs any stage;
2. registers `${parity_coverage_dep:}`: the report stage's dependency for the op-coverage matrix
   (artifacts/suites/coverage when suites are selected, else conf/suites, a path that always
   exists: DVC rejects a missing dependency, and the coverage folder exists only with suites);
3. makes Hydra's error for an unknown option of a multi-select group (`-S 'models=[zzz]'`) list the
   valid options. Hydra 1.3 lists them only for single-select groups ("Could not load 'models/zzz'"
   otherwise). This wraps hydra._internal.defaults_list.config_not_found_error (pinned
   hydra-core==1.3.8); if that private function moves, the wrap is skipped and Hydra's own message
   stands.
"""

from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf


class ParityConfPlugin(SearchPathPlugin):
    """Present so Hydra's discovery has a plugin class here; the search path is left as is."""

    def manipulate_search_path(self, search_path) -> None:  # noqa: D102
        return None


def _validate(*, _root_) -> str:
    from parity import config

    p = OmegaConf.to_container(_root_, resolve=False)
    p.pop("validated", None)
    try:
        config.validate(p)
    except config.ConfigError as e:
        raise ValueError(f"parity: config error: {e}") from None
    return config.summary_line(p)


def _coverage_dep(*, _root_) -> str:
    """The report's coverage input: the suites' coverage folder when suites are selected, else
    conf/suites (DVC needs every dependency to exist; that folder always does)."""
    return "artifacts/suites/coverage" if _root_.get("suites") else "conf/suites"


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
            if not group or "Available options" in str(e):
                raise
            options = repo.get_group_options(group, ObjectType.CONFIG)
            msg = (f"parity: config error: unknown {group} option '{option}' (no conf/{path}.yaml).\n"
                   f"Available options in '{group}': {', '.join(options)}")
            raise MissingConfigException(msg, missing_cfg_file=path, options=options) from None

    config_not_found_error._parity_wrapped = True
    dl.config_not_found_error = config_not_found_error


_wrap_missing_option_error()
