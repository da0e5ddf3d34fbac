from tasks.tracking import redact


def test_redact_hides_passwords_in_urls():
    assert redact("postgresql://optuna:s3cret@db:5432/studies") == (
        "postgresql://optuna:***@db:5432/studies")
    assert redact("https://user:tok%40en@mlflow.example/") == "https://user:***@mlflow.example/"
    assert "s3cret" not in redact("storage=postgresql+psycopg://a:s3cret@h/db, other")


def test_redact_leaves_urls_without_credentials():
    for url in ("sqlite:////tmp/x/optuna.db", "http://127.0.0.1:5000", "s3://bucket/prefix"):
        assert redact(url) == url


def test_grid_experiment_is_tagged_as_model_training_new_or_found(tmp_path):
    """MLflow's UI opens an experiment on its training runs only with this tag (else on the
    GenAI traces view): a new grid experiment has it, and an older one gets it when found."""
    from mlflow.tracking import MlflowClient

    from tasks.tracking import experiment_id

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    new = experiment_id(client, grid_name="g", artifact_root=str(tmp_path))
    assert client.get_experiment(new).tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment("damptune-old", artifact_location=str(tmp_path / "old"))
    assert experiment_id(client, grid_name="old", artifact_root=str(tmp_path)) == old
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
