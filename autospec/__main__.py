from autospec.cli import app

app()
