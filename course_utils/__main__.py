"""`python -m course_utils doctor`: the environment report."""
import sys

from course_utils.environment import main

if __name__ == "__main__":
    if sys.argv[1:] != ["doctor"]:
        print("usage: python -m course_utils doctor", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
