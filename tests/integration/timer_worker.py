"""A worker that uses torch's own FileTimer client (torch.distributed.elastic.timer), as scripts written for
torchrun's watchdog do. Every rank takes a 30 s deadline around a step that finishes at once (released in
time); the rank named by argv[1] then takes a 2 s deadline around a step that never ends, in
slow_data_loading(). The launcher's timer server must send that rank the timer's signal (SIGKILL)."""
import os
import signal
import sys
import time

from torch.distributed.elastic import timer


def slow_data_loading():
    while True:
        time.sleep(3600)


def main():
    stuck_rank = int(sys.argv[1])
    rank = int(os.environ["RANK"])
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGKILL))
    with timer.expires(after=30, scope="quick_step"):
        time.sleep(0.1)
    print(f"rank {rank}: quick step done", flush=True)
    if rank == stuck_rank:
        with timer.expires(after=2, scope="load_batch"):
            slow_data_loading()
    time.sleep(600)  # the others wait (they are stopped with the group)


main()
