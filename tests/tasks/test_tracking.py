from tasks.tracking import redact


def test_redact_hides_passwords_in_urls():
    assert redact("postgresql://optuna:s3cret@db:5432/studies") == (
        "postgresql://optuna:***@db:5432/studies")
    assert redact("https://user:tok%40en@mlflow.example/") == "https://user:***@mlflow.example/"
    assert "s3cret" not in redact("storage=postgresql+psycopg://a:s3cret@h/db, other")


def test_redact_leaves_urls_without_credentials():
    for url in ("sqlite:////tmp/x/optuna.db", "http://127.0.0.1:5000", "s3://bucket/prefix"):
        assert redact(url) == url
