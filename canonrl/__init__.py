"""canonrl: the run contract that the single-file scripts of algos/ import (canonrl.run)."""
