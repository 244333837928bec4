"""The bundled draft/target pair (package data) and the code that trained it (train.py)."""

from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
BUNDLED_TARGET = BUNDLED_DIR / "target"
BUNDLED_DRAFT = BUNDLED_DIR / "draft"
MODEL_CARD = BUNDLED_DIR / "model_card.json"
