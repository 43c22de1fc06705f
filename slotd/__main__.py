from slotd.cli import main

main()
