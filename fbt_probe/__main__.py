from fbt_probe.cli import main

if __name__ == "__main__":  # not when a spawned process re-imports the main module
    main()
