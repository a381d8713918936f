from pathlib import Path

import pytest

from ensemble.config import schema
from ensemble.core.errors import UsageError


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_builtin_defaults_equal_configs_digits_toml():
    cfg = schema.load()
    assert cfg.data.source == "digits"
    assert cfg.aggregation.aggregators == ("mean", "vote")
    assert schema.load(CONFIGS / "digits.toml") == cfg


def test_every_shipped_config_loads():
    paths = sorted(CONFIGS.glob("*.toml"))
    assert len(paths) >= 2
    for path in paths:
        schema.load(path)


def test_overrides_win_and_none_is_ignored():
    cfg = schema.load(overrides={"members.count": 7, "training.epochs": None,
                                 "data.synthetic.rows": 100})
    assert cfg.members.count == 7
    assert cfg.training.epochs == schema.load().training.epochs
    assert cfg.data.synthetic.rows == 100


@pytest.mark.parametrize("table, match", [
    ({"members": {"count": "4"}}, r"`members.count` to be an integer. Received: .*'4'"),
    ({"members": {"count": True}}, r"members.count"),
    ({"members": {"hidden": 64}}, r"members.hidden` to be a list of integers"),
    ({"members": {"hidden": [64, "x"]}}, r"members.hidden\[1\]"),
    ({"training": {"learning_rate": "fast"}}, r"training.learning_rate` to be a number"),
    ({"training": {"lr": 0.1}}, r"Unknown config key `training.lr`"),
    ({"model": {"buidler": "mlp"}}, r"Unknown config key `model.buidler`.*did you mean"),
    ({"model": {"builder": "nosuch"}}, r"Unknown builder 'nosuch'"),
    ({"model": {"params": {"width": 3}}}, r"Unknown parameter `model.params.width` of builder 'mlp'"),
    ({"model": {"builder": "no_such_pkg.mod:fn"}}, r"Cannot import builder 'no_such_pkg.mod:fn'"),
    ({"model": {"builder": "/nonexistent/b.py:build"}}, r"Builder file not found: /nonexistent/b.py"),
    ({"training": {"lr_schedule": "step"}}, r"training.lr_schedule.*'step'"),
    ({"training": {"early_stopping": -1}}, r"training.early_stopping"),
    ({"members": 3}, r"`members` to be a table"),
    ({"members": {"count": 0}}, r"members.count` to be positive"),
    ({"training": {"epochs": -1}}, r"training.epochs` to be auto or a positive integer"),
    ({"training": {"epochs": "long"}}, r"training.epochs` to be auto or a positive integer"),
    ({"training": {"min_delta": -0.1}}, r"training.min_delta` >= 0"),
    ({"members": {"dropout": 1.0}}, r"members.dropout"),
    ({"members": {"activation": "magic"}}, r"members.activation.*'magic'"),
    ({"aggregation": {"aggregators": ["median"]}}, r"aggregation.aggregators.*median"),
    ({"data": {"test_size": 0.0}}, r"data.test_size"),
    ({"data": {"sourse": "iris"}}, r"did you mean `data.source`\?"),
    ({"data": {"impute": "mean"}}, r"data.impute.*median.*'mean'"),
    ({"data": {"categorical": "all"}}, r"data.categorical.*'all'"),
    ({"data": {"categorical": ["a", 3]}}, r"data.categorical"),
])
def test_bad_values_name_the_key(table, match):
    with pytest.raises(UsageError, match=match):
        schema.from_dict(table)


def test_int_is_accepted_for_float():
    assert schema.from_dict({"training": {"learning_rate": 1}}).training.learning_rate == 1.0


def test_file_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        schema.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[members\ncount = ")
    with pytest.raises(UsageError, match="not valid TOML"):
        schema.load(bad)


def test_sha256_changes_with_content():
    a, b = schema.from_dict({}), schema.from_dict({"training": {"seed": 1}})
    assert a.sha256() == schema.from_dict({}).sha256() != b.sha256()


def test_auto_batch_size_and_early_stopping_follow_the_rows():
    """Issue 40: `"auto"` (the default) batch size and patience are functions of the rows and
    the config only; a value the user set is kept and not listed as chosen."""
    from ensemble.config import auto

    cfg = schema.load()
    assert cfg.training.batch_size == "auto" and cfg.training.early_stopping == "auto"
    sizes = {n: auto.resolve(cfg, n, 100)[0].training.batch_size
             for n in (50, 2047, 2048, 8192, 229_000, 10 ** 7)}
    assert sizes == {50: 32, 2047: 32, 2048: 64, 8192: 128, 229_000: 512, 10 ** 7: 1024}
    concrete, chosen = auto.resolve(cfg, 5000, 500)
    assert concrete.training.early_stopping == 6  # max(5, 30 // 5)
    assert set(chosen) == {"training.batch_size", "training.epochs", "training.early_stopping"}
    assert auto.resolve(cfg, 5000, 0)[0].training.early_stopping == 0  # no validation rows
    mine = schema.load(overrides={"training.batch_size": 16, "training.early_stopping": 0,
                                  "training.epochs": 30})
    assert auto.resolve(mine, 5000, 500) == (mine, {})
    with pytest.raises(UsageError, match="batch_size` to be auto or a positive integer"):
        schema.load(overrides={"training.batch_size": "big"})


def test_auto_epochs_give_small_tables_a_step_budget():
    """`"auto"` epochs: at least 2,000 optimizer steps (steps = ceil(rows / batch) an epoch),
    within [30, 200]; 30 without validation rows; the patience follows the chosen epochs."""
    from ensemble.config import auto

    cfg = schema.load()
    assert cfg.training.epochs == "auto" and cfg.training.min_delta == 0.001

    def epochs(n_train, n_val=50):
        t = auto.resolve(cfg, n_train, n_val)[0].training
        return t.batch_size, t.epochs, t.early_stopping

    assert epochs(240) == (32, 200, 20)      # 8 steps an epoch: 250 epochs, capped;
    # patience 200 // 5 = 40, capped at 20
    assert epochs(588) == (32, 106, 20)      # modechoice: 19 steps, ceil(2000 / 19); 21 -> 20
    assert epochs(1500) == (32, 43, 8)       # 47 steps
    assert epochs(2047) == (32, 32, 6)       # 64 steps
    assert epochs(2048) == (64, 63, 12)      # the batch doubles: 32 steps; 63 // 5
    assert auto.patience_for(99, 10) == 19 and auto.patience_for(100, 10) == 20 \
        and auto.patience_for(200, 10) == 20 and auto.patience_for(24, 10) == 5
    assert epochs(4456) == (64, 30, 6)       # fair: 70 steps, 30 is 2,100 steps
    assert epochs(14_133) == (128, 30, 6)    # randhie
    assert epochs(588, 0) == (32, 30, 0)     # no validation rows: no early stopping, 30
    assert auto.epochs_for(588, 32) == 106 and auto.epochs_for(1, 32) == 200
    _, chosen = auto.resolve(cfg, 588, 84)
    assert chosen["training.epochs"] == {
        "value": 106, "rule": "at least 2,000 steps of 19 per epoch, within [30, 200]"}
    assert "up to 106 epochs (auto)" in auto.describe(auto.resolve(cfg, 588, 84)[0], chosen)
    assert schema.load(overrides={"training.epochs": 7}).training.epochs == 7


def test_an_override_without_its_member_index_is_named():
    with pytest.raises(UsageError, match=r"Expected `members.override\[0\].index`, the member "
                       r"the override is for \(0..2\); the override names none"):
        schema.load(overrides={"members.count": 3, "members.override": [{"dropout": 0.2}]})



def test_config_changes_name_tables_by_count_and_entry():
    from ensemble.config.changes import config_changes

    old = {"members": {"count": 3, "override": [{"index": 0, "dropout": 0.1},
                                                {"index": 1, "dropout": 0.2}]}}
    new = {"members": {"count": 3, "override": [{"index": 0, "dropout": 0.1},
                                                {"index": 1, "dropout": 0.3}]}}
    assert config_changes(old, new) == ["members.override[1].dropout: 0.2 -> 0.3"]
    more = {"members": {"count": 4, "override": old["members"]["override"] * 2}}
    assert config_changes(old, more) == ["members.count: 3 -> 4",
                                         "members.override: 2 entries -> 4"]


def test_a_run_recorded_before_min_delta_resumes_with_the_value_it_trained_with():
    """A manifest from before `training.min_delta` has no such key: it trained with none (0.0),
    so that is what a resume is compared with, and the change says how to resume."""
    from ensemble.config.changes import resume_changes

    new = schema.load(overrides={"training.epochs": 30}).to_dict()
    old = {k: dict(v) if isinstance(v, dict) else v for k, v in new.items()}
    del old["training"]["min_delta"]
    assert new["training"]["min_delta"] == 0.001
    assert resume_changes(old, new) == [
        "training.min_delta: 0.0 -> 0.001 (a key added since the run started, which trained "
        "with 0.0: resume with --set training.min_delta=0.0)"]
    again = schema.load(overrides={"training.epochs": 30, "training.min_delta": 0.0}).to_dict()
    assert resume_changes(old, again) == []
    assert resume_changes(new, new) == []
    assert resume_changes(new, again) == ["training.min_delta: 0.001 -> 0.0"]  # recorded: kept


def test_min_delta_is_in_the_units_of_each_tasks_validation_loss():
    """NLL losses: nats per row whatever the target's scale; a point regression member's
    validation loss is its MSE in squared target units, so the drop scales with the target's
    variance (a target of std 0.01 has MSEs near 1e-4, which 0.001 would never let improve)."""
    from ensemble.tasks import Classification as classification
    from ensemble.tasks import Regression as regression

    assert regression(0.0, 0.01, "mse").loss_delta(0.001) == pytest.approx(1e-7)
    assert regression(5.0, 200.0, "mse").loss_delta(0.001) == pytest.approx(40.0)
    assert regression(0.0, 0.01).loss_delta(0.001) == 0.001  # gaussian_nll: nats
    assert classification().loss_delta(0.001) == 0.001
