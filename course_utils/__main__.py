"""`python -m course_utils doctor` (the environment report) and `python -m course_utils diagnose SCRIPT`."""
import sys

USAGE = "usage: python -m course_utils doctor | diagnose SCRIPT [--timeout S] [--max-steps N] [ARGS...]"

if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["doctor"] and len(sys.argv) == 2:
        from course_utils.environment import main
        sys.exit(main())
    if command == ["diagnose"]:
        from course_utils.diagnose import main
        sys.exit(main(sys.argv[2:]))
    print(USAGE, file=sys.stderr)
    sys.exit(2)
