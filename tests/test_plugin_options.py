"""Plug-in options (mmrlvr.train.options): a typo, a missing option or a wrongly typed value in a
reward, objective, shaping, branching or sampler mapping is named before any data or weights
load, all problems at once; every built-in plug-in declares its options; every shipped config
passes; user code is never imported to be checked."""
from __future__ import annotations

import glob
from pathlib import Path

import pytest

from mmrlvr.config import ConfigError, load_config
from mmrlvr.train.options import check_plugins, declared, plugin_problems, spec_problems

ROOT = Path(__file__).resolve().parents[1]


def problems(*overrides: str) -> list[str]:
    return plugin_problems(load_config(str(ROOT / "configs/quickstart.yaml"), list(overrides)))


@pytest.mark.parametrize("override, expected", [
    ("rewards=[{name: accuracy, wieght: 1.0}]",
     "config key 'rewards[0].wieght': reward 'accuracy' takes no option 'wieght' (did you mean "
     "'weight'?)"),
    ("eval_rewards=[{name: format, allow_boxd: true}]",
     "config key 'eval_rewards[0].allow_boxd': reward 'format' takes no option 'allow_boxd' (did "
     "you mean 'allow_boxed'?); it takes ['allow_boxed']"),
    ("objectives=[{name: pirl_consistency, weight: 0.1, epsilom: 0.1}]",
     "'objectives[0].epsilom': objective 'pirl_consistency' takes no option 'epsilom' (did you "
     "mean 'epsilon'?)"),
    ("algo.shaping=[{name: gapo, kapa: 0.3}]",
     "'algo.shaping[0].kapa': shaping method 'gapo' takes no option 'kapa' (did you mean 'kappa'?)"),
    ("rollout.branching={kind: latent_noise, alpah: 0.1}",
     "'rollout.branching.alpah': branching 'latent_noise' takes no option 'alpah' (did you mean "
     "'alpha'?)"),
    ("rollout.branching={kind: image_noise, sigam: 0.1}",
     "'rollout.branching.sigam': branching 'image_noise' takes no option 'sigam' (did you mean "
     "'sigma'?)"),
])
def test_a_misspelt_option_is_named_with_the_nearest_known_one(override, expected):
    found = problems(override)
    assert len(found) == 1 and expected in found[0], found


def test_sampler_options_are_its_keyword_parameters_less_those_the_core_fills():
    found = problems("train.sampler=difficulty", "train.sampler_options={tempreature: 2, texts: [a]}")
    assert len(found) == 2
    assert "'train.sampler_options.tempreature'" in found[0] and "'temperature'" in found[0]
    assert "takes no option 'texts'" in found[1]       # filled from the data, never by the user
    from mmrlvr.methods.difficulty.sampler import build
    known, required = declared(build)
    assert "texts" not in known and "cursor" not in known and "states" in known and not required


@pytest.mark.parametrize("override, expected", [
    ("rewards=[{name: format, allow_boxed: 3}]", "'rewards[0].allow_boxed' must be true or false, got 3"),
    ("rewards=[{name: overlong, max_tokens: 12.5}]",
     "'rewards[0].max_tokens' must be an integer or null, got 12.5"),
    ("algo.shaping=[{name: gmts, fraction: lots}]", "'algo.shaping[0].fraction' must be a number, got 'lots'"),
    ("rollout.branching={kind: latent_noise, site: 3}", "'rollout.branching.site' must be a string, got 3"),
])
def test_a_value_of_the_wrong_simple_type_is_named(override, expected):
    found = problems(override)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("override", [
    "algo.shaping=[{name: gmts, fraction: '1e-1'}]",       # YAML 1.1 leaves it a string
    "rollout.branching={kind: latent_noise, alpha: auto}",
    "algo.shaping=[{name: opdvr, coef: null}]",
    "rewards=[{name: accuracy, weight: 0.9, timeout_s: 5, label: acc}, {name: format, weight: 0.1}]",
])
def test_values_the_plugins_accept_pass(override):
    assert problems(override) == []


def test_every_problem_is_reported_at_once_before_the_model_path_is_read(tmp_path):
    cfg = load_config(str(ROOT / "configs/quickstart.yaml"), [
        f"model.path={tmp_path}/absent", "rewards=[{name: accuracy, wieght: 1}]",
        "algo.shaping=[{name: gapo, kapa: 0.3}]"])
    from mmrlvr.train.setup import build_run
    with pytest.raises(ConfigError) as err:
        build_run(cfg)
    text = str(err.value)
    assert text.startswith("2 problems in the config") and "wieght" in text and "kapa" in text
    assert "absent" not in text and not Path(cfg.train.out_dir).exists()


def test_cli_train_exits_2_naming_the_option(tmp_path, capsys):
    from mmrlvr.cli import main
    rc = main(["train", str(ROOT / "configs/quickstart.yaml"), f"model.path={tmp_path}/absent",
               f"train.out_dir={tmp_path}/run", "rollout.branching={kind: latent_noise, fracton: 0.5}"])
    assert rc == 2
    assert "'rollout.branching.fracton'" in capsys.readouterr().err


def test_every_builtin_plugin_declares_its_options():
    import rewards
    from mmrlvr.algo.shaping import SHAPERS
    from mmrlvr.objectives import OBJECTIVES
    from mmrlvr.rollout.base import BRANCHINGS
    from mmrlvr.train.sampler import SAMPLERS
    open_ended = [f"{reg.kind} {name}" for reg in (rewards.REWARDS, OBJECTIVES, SHAPERS, BRANCHINGS,
                                                   SAMPLERS)
                  for name in reg.names() if declared(reg.get(name)) is None]
    assert open_ended == []


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "configs/*.yaml"))))
def test_every_shipped_config_passes(path):
    assert plugin_problems(load_config(path, [])) == []


def test_user_code_is_not_imported_to_be_checked(tmp_path):
    marker = tmp_path / "imported"
    reward = tmp_path / "my_reward.py"
    reward.write_text(f"open({str(marker)!r}, 'w').close()\n"
                      "def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    assert problems(f"rewards=[{{name: '{reward}:score', any_option: 1}}]") == []
    assert not marker.exists()


def test_a_plugin_that_takes_any_options_is_not_read():
    def factory(**options):
        return options
    assert declared(factory) is None
    assert spec_problems("x", "plug-in", factory, {"anything": 1}) == []


def test_check_plugins_raises_one_line_for_one_problem():
    cfg = load_config(str(ROOT / "configs/quickstart.yaml"), ["algo.shaping=[{name: cliff, befor: 1}]"])
    with pytest.raises(ConfigError, match=r"^config key 'algo.shaping\[0\].befor': shaping method "
                                          r"'cliff' takes no option 'befor' \(did you mean 'before'\?\)"):
        check_plugins(cfg)
