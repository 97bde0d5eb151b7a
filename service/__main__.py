from service.main import main

main()
