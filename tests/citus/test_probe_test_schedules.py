from tests.test_schedules import *  # noqa
