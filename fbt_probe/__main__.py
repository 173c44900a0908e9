from fbt_probe.cli import main

main()
