import pathlib
import sys

# tests/gradcheck.py and friends are imported as plain modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))
