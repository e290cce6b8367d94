from rlmq.cli.app import main

main()
