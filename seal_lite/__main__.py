from seal_lite.cli import main

main()
