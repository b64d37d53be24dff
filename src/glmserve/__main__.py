from glmserve.cli import main

# guarded: engines that spawn processes (vLLM's engine core) re-import __main__ in the child
if __name__ == "__main__":
    raise SystemExit(main())
