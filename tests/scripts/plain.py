"""Not a Ray Train script: it runs, and the runner says which guarantees do not apply."""
import sys

print("plain script ran with", sys.argv[1:])
