! Fortran link/run test without MPI: version, error strings, and a single-rank communicator
! (ncclUniqueId passed by value, ncclConfig_t by reference) with a host-memory allreduce.
! Prints one PASS/FAIL line per check and "N passed, M failed"; exits non-zero on failure.
program version
  use, intrinsic :: iso_c_binding
  use ferroccl
  implicit none
  integer(c_int) :: v, res, n, r
  integer :: passed = 0, failed = 0
  type(ncclUniqueId) :: id
  type(ncclConfig_t) :: config
  type(c_ptr) :: comm
  real(c_float), target :: send(8), recv(8)
  character(len=:), allocatable :: msg

  res = ncclGetVersion(v)
  print '(a,i0,a,i0,a)', 'ncclGetVersion: ', v, ' (module ', NCCL_VERSION_CODE, ')'
  call check(res == ncclSuccess .and. v == NCCL_VERSION_CODE, 'ncclGetVersion == NCCL_VERSION_CODE')
  call check(nccl_version(2_c_int, 27_c_int, 7_c_int) == 22707, 'nccl_version(2,27,7) == 22707')
  call check(nccl_error_string(ncclSuccess) == 'no error', 'nccl_error_string(ncclSuccess)')
  call check(nccl_error_string(ncclTimeout) == 'timeout', 'nccl_error_string(ncclTimeout)')
  call check(nccl_error_string(ncclInvalidArgument) == &
    'invalid argument (run with NCCL_DEBUG=WARN for details)', 'nccl_error_string(ncclInvalidArgument)')

  res = ncclCommCount(c_null_ptr, n)
  msg = nccl_last_error()
  call check(res == ncclInvalidArgument, 'ncclCommCount(NULL) = ncclInvalidArgument')
  call check(len(msg) > 0, 'nccl_last_error() non-empty after an error: "' // msg // '"')

  res = ncclGetUniqueId(id)
  call check(res == ncclSuccess, 'ncclGetUniqueId')
  config = ncclConfigInitializer()
  config%blocking = 1
  res = ncclCommInitRankConfig(comm, 1_c_int, id, 0_c_int, config)
  call check(res == ncclSuccess, 'ncclCommInitRankConfig(1 rank, by-value id, config): ' // &
    nccl_error_string(res))
  if (res == ncclSuccess) then
    call check(ncclCommCount(comm, n) == ncclSuccess .and. n == 1, 'ncclCommCount == 1')
    call check(ncclCommUserRank(comm, r) == ncclSuccess .and. r == 0, 'ncclCommUserRank == 0')
    send = [(real(r + 1, c_float) * 1.5_c_float, r = 1, 8)]
    recv = 0
    res = ncclAllReduce(c_loc(send), c_loc(recv), 8_c_size_t, ncclFloat32, ncclSum, comm, c_null_ptr)
    call check(res == ncclSuccess .and. all(recv == send), '1-rank ncclAllReduce(ncclFloat32, ncclSum)')
    msg = ferroccl_encryption_report(comm, res)
    call check(res == ncclSuccess .and. len(msg) > 1, 'ferroccl_encryption_report (JSON): ' // msg(1:min(len(msg), 60)))
    call check(ncclCommDestroy(comm) == ncclSuccess, 'ncclCommDestroy')
  end if
  res = ncclCommInitRank(comm, 0_c_int, id, 0_c_int)
  call check(res == ncclInvalidArgument, 'ncclCommInitRank(nranks 0) = ncclInvalidArgument')

  print '(i0,a,i0,a)', passed, ' passed, ', failed, ' failed'
  if (failed /= 0) error stop 1

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      passed = passed + 1
      print '(a)', 'PASS ' // what
    else
      failed = failed + 1
      print '(a)', 'FAIL ' // what
    end if
  end subroutine check
end program version
